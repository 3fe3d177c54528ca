#include "transport/probe/probe.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <vector>

#include "transport/probe/tcp_counters.hpp"

namespace geoloco::probe {

using transport::FrameKind;
using transport::OpHandle;
using transport::Transport;

namespace {

using Clock = std::chrono::steady_clock;
constexpr FrameKind kKind = FrameKind::kProbe;
// Commands (ping-phase, stream, result) travel on shard 0; every other message type uses its
// type number as shard, so a receiver always knows the key of what it waits for.
constexpr uint32_t kCommandShard = 0;

double secs(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::string limited_note(const StreamResult& s, const RttStats& rtt) {
  std::string out;
  if (s.receiver.coarse)
    out += fmt::format(" (coarse: only {} messages for a window of {}; raise --seconds or lower --message-bytes)",
                       s.receiver.messages, s.window);
  if (pipeline_limited(s, rtt.median_ms))
    out += fmt::format(
        " (may be limited by the probe itself: {} x {} bytes in flight is under twice the "
        "bandwidth-delay product; raise --window or --message-bytes)",
        s.window, s.message_bytes);
  return out;
}

// One side of one probe: the peer, the session and the command counter both sides advance.
class Session {
 public:
  Session(Transport& t, int peer, const ProbeOptions& opt) : t_(t), peer_(peer), opt_(opt) {
    if (peer < 0 || static_cast<size_t>(peer) >= t.peers().size())
      throw InputError(fmt::format("probe: no peer with index {} (the transport has {})", peer, t.peers().size()));
    name_ = t.peers()[static_cast<size_t>(peer)].name();
  }

  ProbeResult initiate();
  ProbeResult respond();

 private:
  [[noreturn]] void violation(const std::string& what) const {
    throw ProbeError(fmt::format("probe with {}: protocol violation: {}", name_, what));
  }
  // Decodes a header and checks type, session and sequence number.
  Header expect(std::span<const uint8_t> msg, MsgType type, uint64_t seq) const {
    std::string err;
    auto h = decode_header(msg, err);
    if (!h) violation(fmt::format("{}: {}", to_string(type), err));
    if (h->session != opt_.session)
      violation(fmt::format("{}: session {}, expected {}", to_string(type), h->session, opt_.session));
    if (h->type != type) violation(fmt::format("got a {} message, expected {}", to_string(h->type), to_string(type)));
    if (h->seq != seq) violation(fmt::format("{}: seq {}, expected {}", to_string(type), h->seq, seq));
    return *h;
  }
  Header header(MsgType type, uint64_t seq, uint32_t flags = 0) const { return Header{type, opt_.session, flags, seq}; }
  uint64_t round(uint32_t command, uint64_t seq = 0) const { return round_of(opt_.session, command, seq); }
  void note(const std::string& s) const {
    if (opt_.progress) opt_.progress(s);
  }
  // Runs `fn`, turning a transport failure into a ProbeError that names the phase.
  template <class F>
  auto phase(const char* what, F&& fn) -> decltype(fn()) {
    try {
      return fn();
    } catch (const ProbeError&) {
      throw;
    } catch (const InputError&) {
      throw;
    } catch (const std::exception& e) {
      throw ProbeError(fmt::format("probe with {} failed during {}: {}", name_, what, e.what()));
    }
  }

  // Initiator.
  RttStats pings(uint32_t command);
  StreamResult stream(uint32_t command, uint32_t phase_index, int lane, double omit_s);
  // Responder.
  void echo_pings(uint32_t command, const PingPhase& p);
  void receive_stream(uint32_t command, const StreamPhase& s);

  Transport& t_;
  int peer_;
  const ProbeOptions& opt_;
  std::string name_;
};

// ---- initiator ----------------------------------------------------------------------------

RttStats Session::pings(uint32_t command) {
  const uint32_t total = opt_.ping_warmup + opt_.ping_count;
  {
    auto msg =
        encode_ping_phase(header(MsgType::kPingPhase, command), {opt_.ping_count, opt_.ping_warmup, opt_.ping_bytes});
    t_.send(peer_, kKind, round(command), kCommandShard, transport::make_payload(std::move(msg))).wait();
  }
  std::vector<double> samples;
  samples.reserve(opt_.ping_count);
  for (uint32_t i = 0; i < total; ++i) {
    std::vector<uint8_t> ping(opt_.ping_bytes);
    for (size_t k = kHeaderBytes; k < ping.size(); ++k) ping[k] = static_cast<uint8_t>(k * 31 + i);
    encode_header(header(MsgType::kPing, i), ping);
    auto r = t_.recv(peer_, kKind, round(command, i), static_cast<uint32_t>(MsgType::kPong), opt_.ping_bytes);
    const auto sent = transport::make_payload(std::move(ping));
    const auto t0 = Clock::now();
    auto s = t_.send(peer_, kKind, round(command, i), static_cast<uint32_t>(MsgType::kPing), sent);
    s.wait();
    r.wait();
    const double ms = secs(Clock::now() - t0) * 1e3;
    const std::vector<uint8_t>& ping_bytes = *sent;
    if (r.bytes() != ping_bytes.size())
      violation(fmt::format("pong {}: {} bytes, expected {}", i, r.bytes(), ping_bytes.size()));
    const std::vector<uint8_t> pong = r.take();
    expect(pong, MsgType::kPong, i);
    if (!std::equal(ping_bytes.begin() + kHeaderBytes, ping_bytes.end(), pong.begin() + kHeaderBytes))
      violation(fmt::format("pong {}: the echo differs from the ping", i));
    if (i >= opt_.ping_warmup) samples.push_back(ms);
  }
  return RttStats::of(samples);
}

StreamResult Session::stream(uint32_t command, uint32_t phase_index, int lane, double omit_s) {
  StreamPhase sp{phase_index, lane, opt_.message_bytes, opt_.window, omit_s};
  {
    auto msg = encode_stream_phase(header(MsgType::kStream, command), sp);
    t_.send(peer_, kKind, round(command), kCommandShard, transport::make_payload(std::move(msg))).wait();
  }
  // A pool of window messages, each rewritten (its header) once its send completed: the
  // transport reads a payload only until then.
  std::vector<std::shared_ptr<std::vector<uint8_t>>> bufs(opt_.window);
  for (auto& b : bufs) {
    b = std::make_shared<std::vector<uint8_t>>(opt_.message_bytes);
    for (size_t k = kHeaderBytes; k < b->size(); ++k) (*b)[k] = static_cast<uint8_t>(k * 131 + 7);
  }

  struct InFlight {
    OpHandle h;
    size_t buf;
    bool full;
    uint64_t bytes;
  };
  std::deque<InFlight> inflight;
  std::vector<size_t> free_bufs;
  for (size_t i = 0; i < bufs.size(); ++i) free_bufs.push_back(i);
  const auto before = read_tcp_counters();
  const auto start = Clock::now();
  // Time-limited streams run for omit + seconds and, so that the receiver's estimate has two
  // windows of completions after the omit plus the draining one, until 3 x window messages
  // completed after the omit -- but never past omit + 4 x seconds (slow links: the receiver
  // then reports too few messages rather than the probe running for minutes).
  const double run_s = omit_s + opt_.seconds, cap_s = omit_s + 4 * opt_.seconds;
  const uint64_t enough_after_omit = 3ull * opt_.window;
  uint64_t seq = 0, full_issued_bytes = 0, full_done_bytes = 0, done_after_omit = 0;
  std::optional<uint64_t> stop_first;  // first message of the tail (kFlagStop)
  std::optional<Clock::time_point> first_done;
  Clock::time_point last_full_done = start;
  while (true) {
    while (!free_bufs.empty() && !(stop_first && seq >= *stop_first + opt_.window)) {
      if (!stop_first && seq >= 2) {
        const double el = secs(Clock::now() - start);
        const bool time_up = opt_.seconds > 0 && ((el >= run_s && done_after_omit >= enough_after_omit) || el >= cap_s);
        const bool bytes_up = opt_.bytes > 0 && full_issued_bytes >= opt_.bytes;
        if (time_up || bytes_up || seq + opt_.window >= kMaxSeq) stop_first = seq;
      }
      const bool full = !stop_first;
      const size_t b = free_bufs.back();
      free_bufs.pop_back();
      encode_header(header(MsgType::kData, seq, full ? 0 : kFlagStop), *bufs[b]);
      // The tail's header-only messages are their own small payloads.
      const transport::Payload payload =
          full ? transport::Payload(bufs[b])
               : transport::make_payload(std::vector<uint8_t>(bufs[b]->begin(), bufs[b]->begin() + kHeaderBytes));
      const uint64_t r = round(command, seq);
      const auto shard = static_cast<uint32_t>(MsgType::kData);
      OpHandle h =
          lane >= 0 ? t_.send_on_lane(peer_, lane, kKind, r, shard, payload) : t_.send(peer_, kKind, r, shard, payload);
      inflight.push_back({h, b, full, payload->size()});
      if (full) full_issued_bytes += payload->size();
      ++seq;
    }
    if (inflight.empty()) break;
    InFlight f = inflight.front();
    inflight.pop_front();
    f.h.wait();
    if (f.full) {
      last_full_done = Clock::now();
      full_done_bytes += f.bytes;
      // The receiver counts time from its first completion; a send completes about then.
      if (!first_done) first_done = last_full_done;
      if (secs(last_full_done - *first_done) >= omit_s) ++done_after_omit;
    }
    free_bufs.push_back(f.buf);
  }
  const auto after = read_tcp_counters();
  // Posted only now: a recv counts against transfer_timeout_s from when it is posted, and the
  // report may arrive first (it is then held until posted).
  auto report_h = t_.recv(peer_, kKind, round(command), static_cast<uint32_t>(MsgType::kReport), kMaxControlBytes);
  report_h.wait();
  const std::vector<uint8_t> report_buf = report_h.take();
  const std::span<const uint8_t> msg(report_buf.data(), report_h.bytes());
  expect(msg, MsgType::kReport, command);
  std::string err;
  auto rep = decode_report(body_of(msg), err);
  if (!rep) violation(err);
  if (rep->phase != phase_index) violation(fmt::format("report: phase {}, expected {}", rep->phase, phase_index));
  const uint64_t sent_full = stop_first.value_or(seq);
  if (rep->messages != sent_full)
    violation(fmt::format("report: {} messages received, {} were sent", rep->messages, sent_full));

  StreamResult out;
  out.connections = lane >= 0 ? 1 : t_.lanes();
  out.lane = lane;
  out.message_bytes = opt_.message_bytes;
  out.window = opt_.window;
  out.receiver = *rep;
  out.gbps = report_gbps(*rep);
  out.sender_s = secs(last_full_done - start);
  out.sender_gbps = out.sender_s > 0 ? static_cast<double>(full_done_bytes) * 8 / out.sender_s / 1e9 : 0;
  if (before && after && after->out_segs >= before->out_segs && after->retrans_segs >= before->retrans_segs)
    out.retransmits = Retransmits{after->retrans_segs - before->retrans_segs, after->out_segs - before->out_segs};
  if (rep->counted_bytes == 0 || !(rep->counted_s > 0))
    throw ProbeError(fmt::format(
        "probe with {}: the {} stream is too short to measure: {} message(s) of {} bytes "
        "arrived in {:.1f} s (raise --seconds/--bytes, or lower --message-bytes)",
        name_, lane >= 0 ? "single-connection" : "all-lanes", rep->messages, opt_.message_bytes, rep->first_to_last_s));
  return out;
}

ProbeResult Session::initiate() {
  ProbeResult res;
  res.initiator = t_.self().site;
  res.responder = t_.peers()[static_cast<size_t>(peer_)].site;
  res.lanes = t_.lanes();
  uint32_t command = 0;
  res.rtt = phase("the round-trip pings", [&] { return pings(command++); });
  note(fmt::format("rtt to {}: median {:.3f} ms, p99 {:.3f} ms ({} pings)", name_, res.rtt.median_ms, res.rtt.p99_ms,
                   res.rtt.count));
  const double omit = opt_.omit_s.value_or(default_omit_s(res.rtt.median_ms));
  if (opt_.single) {
    res.single = phase("the single-connection stream", [&] { return stream(command++, 0, 0, omit); });
    note(fmt::format("1 connection to {}: {:.4g} Gbit/s{}", name_, res.single->gbps,
                     limited_note(*res.single, res.rtt)));
  }
  if (opt_.multi && t_.lanes() > 1) {
    res.multi = phase("the all-lanes stream", [&] { return stream(command++, 1, -1, omit); });
    note(fmt::format("{} connections to {}: {:.4g} Gbit/s{}", t_.lanes(), name_, res.multi->gbps,
                     limited_note(*res.multi, res.rtt)));
  }
  phase("the result exchange", [&] {
    auto a = t_.recv(peer_, kKind, round(command), static_cast<uint32_t>(MsgType::kResultAck), kMaxControlBytes);
    auto msg = encode_results(header(MsgType::kResult, command), {res});
    t_.send(peer_, kKind, round(command), kCommandShard, transport::make_payload(std::move(msg))).wait();
    a.wait();
    const auto ack = a.take();
    expect(std::span<const uint8_t>(ack.data(), a.bytes()), MsgType::kResultAck, command);
  });
  return res;
}

// ---- responder ----------------------------------------------------------------------------

void Session::echo_pings(uint32_t command, const PingPhase& p) {
  const uint32_t total = p.warmup + p.count;
  const auto ping_shard = static_cast<uint32_t>(MsgType::kPing);
  OpHandle next = t_.recv(peer_, kKind, round(command, 0), ping_shard, p.bytes);
  for (uint32_t i = 0; i < total; ++i) {
    OpHandle cur = next;
    cur.wait();
    if (i + 1 < total) next = t_.recv(peer_, kKind, round(command, i + 1), ping_shard, p.bytes);
    std::vector<uint8_t> pong = cur.take();
    if (cur.bytes() != p.bytes) violation(fmt::format("ping {}: {} bytes, expected {}", i, cur.bytes(), p.bytes));
    expect(pong, MsgType::kPing, i);
    encode_header(header(MsgType::kPong, i), pong);
    t_.send(peer_, kKind, round(command, i), static_cast<uint32_t>(MsgType::kPong),
            transport::make_payload(std::move(pong)))
        .wait();
  }
}

void Session::receive_stream(uint32_t command, const StreamPhase& s) {
  if (s.lane >= t_.lanes()) violation(fmt::format("stream: lane {} but the transport has {}", s.lane, t_.lanes()));
  struct Posted {
    uint64_t seq;
    OpHandle h;
  };
  std::deque<Posted> posted;
  const auto shard = static_cast<uint32_t>(MsgType::kData);
  for (uint32_t i = 0; i < s.window; ++i)
    posted.push_back({i, t_.recv(peer_, kKind, round(command, i), shard, s.message_bytes)});
  uint64_t next = s.window;
  std::vector<Clock::time_point> arrived;  // completion of every full message, in seq order
  std::vector<uint64_t> sizes;             // and its size
  bool tail = false;
  while (!posted.empty()) {
    Posted p = posted.front();
    posted.pop_front();
    p.h.wait();
    const auto now = Clock::now();
    std::vector<uint8_t> buf = p.h.take();  // posted again for the next message
    const std::span<const uint8_t> msg(buf.data(), p.h.bytes());
    const Header h = expect(msg, MsgType::kData, p.seq);
    const bool stop = (h.flags & kFlagStop) != 0;
    if (!stop) {
      if (tail) violation(fmt::format("data {}: a full message after the stream's tail began", p.seq));
      if (msg.size() != s.message_bytes)
        violation(fmt::format("data {}: {} bytes, expected {}", p.seq, msg.size(), s.message_bytes));
      arrived.push_back(now);
      sizes.push_back(s.message_bytes);
      if (next > kMaxSeq) violation("data: more messages than the protocol allows");
      posted.push_back({next, t_.recv(peer_, kKind, round(command, next), shard, std::move(buf))});
      ++next;
    } else {
      if (msg.size() != kHeaderBytes) violation(fmt::format("data {}: a tail message of {} bytes", p.seq, msg.size()));
      tail = true;
    }
  }
  std::vector<double> t(arrived.size());  // seconds since the first completion
  for (size_t i = 0; i < arrived.size(); ++i) t[i] = secs(arrived[i] - arrived.front());
  StreamReport rep = estimate_stream(t, sizes, s.window, s.omit_s);
  rep.phase = s.phase;
  auto msg = encode_report(header(MsgType::kReport, command), rep);
  t_.send(peer_, kKind, round(command), static_cast<uint32_t>(MsgType::kReport),
          transport::make_payload(std::move(msg)))
      .wait();
}

ProbeResult Session::respond() {
  for (uint32_t command = 0; command <= kMaxCommands; ++command) {
    Header h;
    size_t n = 0;
    std::vector<uint8_t> buf;
    phase("waiting for the initiator's next command", [&] {
      auto r = t_.recv(peer_, kKind, round(command), kCommandShard, kMaxControlBytes);
      r.wait();
      n = r.bytes();
      buf = r.take();
    });
    const std::span<const uint8_t> msg(buf.data(), n);
    std::string err;
    auto hd = decode_header(msg, err);
    if (!hd) violation("command: " + err);
    h = *hd;
    if (h.session != opt_.session) violation(fmt::format("command: session {}, expected {}", h.session, opt_.session));
    if (h.seq != command) violation(fmt::format("command: seq {}, expected {}", h.seq, command));
    switch (h.type) {
      case MsgType::kPingPhase: {
        auto p = decode_ping_phase(body_of(msg), err);
        if (!p) violation(err);
        phase("the round-trip pings", [&] { echo_pings(command, *p); });
        note(fmt::format("echoed {} pings from {}", p->warmup + p->count, name_));
        break;
      }
      case MsgType::kStream: {
        auto s = decode_stream_phase(body_of(msg), err);
        if (!s) violation(err);
        phase(s->lane >= 0 ? "the single-connection stream" : "the all-lanes stream",
              [&] { receive_stream(command, *s); });
        break;
      }
      case MsgType::kResult: {
        auto rs = decode_results(body_of(msg), err);
        if (!rs) violation(err);
        if (rs->size() != 1) violation(fmt::format("result: {} results, expected 1", rs->size()));
        ProbeResult res = rs->front();
        const std::string& peer_site = t_.peers()[static_cast<size_t>(peer_)].site;
        if (res.initiator != peer_site || res.responder != t_.self().site)
          violation(fmt::format("result: names {} -> {}, expected {} -> {}", res.initiator, res.responder, peer_site,
                                t_.self().site));
        phase("the result exchange", [&] {
          std::vector<uint8_t> ack(kHeaderBytes);
          encode_header(header(MsgType::kResultAck, command), ack);
          t_.send(peer_, kKind, round(command), static_cast<uint32_t>(MsgType::kResultAck),
                  transport::make_payload(std::move(ack)))
              .wait();
        });
        return res;
      }
      default: violation(fmt::format("command: unexpected {} message", to_string(h.type)));
    }
  }
  violation("too many commands");
}

}  // namespace

double default_omit_s(double rtt_median_ms) { return 0.2 + 10 * rtt_median_ms / 1e3; }

StreamReport estimate_stream(std::span<const double> t, std::span<const uint64_t> sizes, uint32_t window,
                             double omit_s) {
  GEOLOCO_CHECK(t.size() == sizes.size(), "{} times for {} sizes", t.size(), sizes.size());
  StreamReport rep;
  const size_t K = t.size();
  std::vector<double> C(K);  // bytes completed up to and including message i
  double total = 0;
  for (size_t i = 0; i < K; ++i) C[i] = total += static_cast<double>(sizes[i]);
  rep.messages = K;
  rep.bytes = static_cast<uint64_t>(total);
  if (K < 2) return rep;
  rep.first_to_last_s = t[K - 1] - t[0];
  const size_t W = std::max<size_t>(window, 1);
  // First counted completion: the first at or after the omitted start.
  size_t a = 0;
  while (a + 1 < K && t[a] - t[0] < omit_s) ++a;
  // Last: before the final window drains (those messages have no successors in flight, and
  // the last burst may be a partial window).
  if (K < 3 * W) {  // too short for centroids: first to last, flagged
    rep.coarse = true;
    if (t[K - 1] > t[0]) {
      rep.counted_bytes = static_cast<uint64_t>(C[K - 1] - C[0]);
      rep.counted_s = t[K - 1] - t[0];
    }
    return rep;
  }
  const size_t b = K - 1 - W;
  if (b + 1 < a + 2 * W) a = 0;  // give up the omit before giving up
  auto mean = [&](const auto& v, size_t from) {
    double sum = 0;
    for (size_t i = from; i < from + W; ++i) sum += static_cast<double>(v[i]);
    return sum / static_cast<double>(W);
  };
  const double bytes = mean(C, b + 1 - W) - mean(C, a);
  const double s = mean(t, b + 1 - W) - mean(t, a);
  rep.omitted_s = t[a] - t[0];
  if (s > 0) {
    rep.counted_bytes = static_cast<uint64_t>(std::llround(bytes));
    rep.counted_s = s;
  }
  return rep;
}

void ProbeOptions::validate() const {
  if (session > kMaxSession) throw InputError(fmt::format("probe: session {} > {}", session, kMaxSession));
  if (ping_count < 1 || ping_count > kMaxPings)
    throw InputError(fmt::format("probe: --count {} outside [1, {}]", ping_count, kMaxPings));
  if (ping_warmup > kMaxPings) throw InputError(fmt::format("probe: --warmup {} > {}", ping_warmup, kMaxPings));
  if (ping_bytes < kHeaderBytes || ping_bytes > kMaxPingBytes)
    throw InputError(fmt::format("probe: --ping-bytes {} outside [{}, {}]", ping_bytes, kHeaderBytes, kMaxPingBytes));
  if (!std::isfinite(seconds) || seconds < 0 || seconds > 3600)
    throw InputError(fmt::format("probe: --seconds {} outside [0, 3600]", seconds));
  if (seconds == 0 && bytes == 0) throw InputError("probe: give --seconds > 0 or --bytes > 0 for the streams");
  if (omit_s && (!std::isfinite(*omit_s) || *omit_s < 0 || *omit_s > 3600))
    throw InputError(fmt::format("probe: --omit {} outside [0, 3600]", *omit_s));
  if (message_bytes < kMinMessageBytes || message_bytes > kMaxMessageBytes)
    throw InputError(
        fmt::format("probe: --message-bytes {} outside [{}, {}]", message_bytes, kMinMessageBytes, kMaxMessageBytes));
  if (window < 1 || window > kMaxWindow)
    throw InputError(fmt::format("probe: --window {} outside [1, {}]", window, kMaxWindow));
}

ProbeResult probe_peer(Transport& t, int peer, Role role, const ProbeOptions& opt) {
  opt.validate();
  Session s(t, peer, opt);
  return role == Role::kInitiator ? s.initiate() : s.respond();
}

}  // namespace geoloco::probe

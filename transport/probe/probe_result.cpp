#include "transport/probe/probe_result.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <numeric>

#include "core/error.hpp"
#include "transport/wire.hpp"

namespace geoloco::probe {

double percentile(std::vector<double> v, double q) {
  GEOLOCO_CHECK(!v.empty() && q >= 0.0 && q <= 1.0, "percentile of {} values at {}", v.size(), q);
  std::sort(v.begin(), v.end());
  std::size_t rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(v.size())));
  rank = std::clamp<std::size_t>(rank, 1, v.size());
  return v[rank - 1];
}

RttStats RttStats::of(const std::vector<double>& rtt_ms) {
  GEOLOCO_CHECK(!rtt_ms.empty(), "no RTT samples");
  RttStats s;
  s.count = static_cast<uint32_t>(rtt_ms.size());
  s.min_ms = *std::min_element(rtt_ms.begin(), rtt_ms.end());
  s.max_ms = *std::max_element(rtt_ms.begin(), rtt_ms.end());
  s.mean_ms = std::accumulate(rtt_ms.begin(), rtt_ms.end(), 0.0) / static_cast<double>(rtt_ms.size());
  s.median_ms = percentile(rtt_ms, 0.5);
  s.p99_ms = percentile(rtt_ms, 0.99);
  return s;
}

using transport::wire::Reader;
using transport::wire::Writer;

namespace {

constexpr size_t kMaxSiteBytes = 64;
constexpr int kMaxLanes = 1024;

void put_f64(Writer& w, double v) { w.u64(std::bit_cast<uint64_t>(v)); }

// Decoding state: the first problem wins; every later read is a no-op.
struct In {
  Reader r;
  std::string& error;
  bool ok() const { return error.empty(); }
  void fail(const std::string& e) {
    if (error.empty()) error = e;
  }
  uint32_t u32(const char* f) {
    uint32_t v = 0;
    if (ok() && !r.u32(v)) fail(fmt::format("{}: truncated", f));
    return v;
  }
  uint64_t u64(const char* f) {
    uint64_t v = 0;
    if (ok() && !r.u64(v)) fail(fmt::format("{}: truncated", f));
    return v;
  }
  uint8_t u8(const char* f) {
    uint8_t v = 0;
    if (ok() && !r.u8(v)) fail(fmt::format("{}: truncated", f));
    return v;
  }
  // Finite and in [0, max].
  double f64(const char* f, double max = 1e12) {
    uint64_t x = u64(f);
    double v = std::bit_cast<double>(x);
    if (ok() && (!std::isfinite(v) || v < 0 || v > max)) fail(fmt::format("{}: {} is outside [0, {}]", f, v, max));
    return ok() ? v : 0;
  }
  std::string str(const char* f) {
    std::string s;
    if (ok() && !r.str(s, kMaxSiteBytes)) fail(fmt::format("{}: truncated or longer than {} bytes", f, kMaxSiteBytes));
    return s;
  }
};

void put_stream(Writer& w, const StreamResult& s) {
  w.u32(static_cast<uint32_t>(s.connections));
  w.u32(static_cast<uint32_t>(s.lane));
  w.u64(s.message_bytes);
  w.u32(s.window);
  w.u64(s.receiver.messages);
  w.u64(s.receiver.bytes);
  w.u64(s.receiver.counted_bytes);
  put_f64(w, s.receiver.counted_s);
  put_f64(w, s.receiver.first_to_last_s);
  put_f64(w, s.receiver.omitted_s);
  w.u8(s.receiver.coarse ? 1 : 0);
  put_f64(w, s.gbps);
  put_f64(w, s.sender_s);
  put_f64(w, s.sender_gbps);
  w.u8(s.retransmits ? 1 : 0);
  if (s.retransmits) {
    w.u64(s.retransmits->retrans_segs);
    w.u64(s.retransmits->out_segs);
  }
}

StreamResult get_stream(In& in, uint32_t phase) {
  StreamResult s;
  s.connections = static_cast<int>(in.u32("stream.connections"));
  s.lane = static_cast<int32_t>(in.u32("stream.lane"));
  s.message_bytes = in.u64("stream.message_bytes");
  s.window = in.u32("stream.window");
  s.receiver.phase = phase;
  s.receiver.messages = in.u64("stream.messages");
  s.receiver.bytes = in.u64("stream.bytes");
  s.receiver.counted_bytes = in.u64("stream.counted_bytes");
  s.receiver.counted_s = in.f64("stream.counted_s");
  s.receiver.first_to_last_s = in.f64("stream.first_to_last_s");
  s.receiver.omitted_s = in.f64("stream.omitted_s");
  const uint8_t coarse = in.u8("stream.coarse");
  if (in.ok() && coarse > 1) in.fail(fmt::format("stream.coarse: {}", coarse));
  s.receiver.coarse = coarse == 1;
  s.gbps = in.f64("stream.gbps");
  s.sender_s = in.f64("stream.sender_s");
  s.sender_gbps = in.f64("stream.sender_gbps");
  uint8_t has = in.u8("stream.has_retransmits");
  if (in.ok() && has > 1) in.fail(fmt::format("stream.has_retransmits: {}", has));
  if (has == 1) {
    Retransmits r;
    r.retrans_segs = in.u64("stream.retrans_segs");
    r.out_segs = in.u64("stream.out_segs");
    s.retransmits = r;
  }
  if (in.ok() && (s.connections < 1 || s.connections > kMaxLanes))
    in.fail(fmt::format("stream.connections: {} outside [1, {}]", s.connections, kMaxLanes));
  if (in.ok() && (s.lane < -1 || s.lane >= kMaxLanes)) in.fail(fmt::format("stream.lane: {}", s.lane));
  if (in.ok() && s.receiver.counted_bytes > s.receiver.bytes)
    in.fail("stream.counted_bytes: more than the bytes received");
  return s;
}

}  // namespace

double Retransmits::pct() const {
  const double all = static_cast<double>(out_segs) + static_cast<double>(retrans_segs);
  return all > 0 ? 100.0 * static_cast<double>(retrans_segs) / all : 0.0;
}

double report_gbps(const StreamReport& r) {
  return r.counted_s > 0 ? static_cast<double>(r.counted_bytes) * 8.0 / r.counted_s / 1e9 : 0.0;
}

nlohmann::json to_json(const RttStats& r) {
  return {{"count", r.count},  {"min", r.min_ms}, {"median", r.median_ms},
          {"mean", r.mean_ms}, {"p99", r.p99_ms}, {"max", r.max_ms}};
}

nlohmann::json to_json(const StreamResult& s) {
  nlohmann::json j = {
      {"connections", s.connections},
      {"lane", s.lane < 0 ? nlohmann::json("all") : nlohmann::json(s.lane)},
      {"gbps", s.gbps},
      {"message_bytes", s.message_bytes},
      {"window", s.window},
      {"messages", s.receiver.messages},
      {"bytes", s.receiver.bytes},
      {"counted_bytes", s.receiver.counted_bytes},
      {"counted_s", s.receiver.counted_s},
      {"omitted_s", s.receiver.omitted_s},
      {"first_to_last_s", s.receiver.first_to_last_s},
      {"estimate", s.receiver.coarse ? "first-to-last (coarse: fewer than 3 x window messages arrived)" : "centroids"},
      {"sender_s", s.sender_s},
      {"sender_gbps", s.sender_gbps}};
  if (s.retransmits) {
    j["retransmits"] = {{"retrans_segs", s.retransmits->retrans_segs},
                        {"out_segs", s.retransmits->out_segs},
                        {"pct", s.retransmits->pct()},
                        {"source",
                         "/proc/net/snmp Tcp RetransSegs/OutSegs delta in the sender's network namespace "
                         "(every TCP socket in it, during this stream)"}};
  } else {
    j["retransmits"] = nullptr;
  }
  return j;
}

bool pipeline_limited(const StreamResult& s, double rtt_ms) {
  const double in_flight = static_cast<double>(s.window) * static_cast<double>(s.message_bytes);
  const double bdp = s.gbps * 1e9 / 8 * rtt_ms / 1e3;
  return in_flight < 2 * bdp;
}

nlohmann::json to_json(const ProbeResult& r) {
  auto stream = [&](const std::optional<StreamResult>& s) {
    if (!s) return nlohmann::json(nullptr);
    auto j = to_json(*s);
    j["pipeline_limited"] = pipeline_limited(*s, r.rtt.median_ms);
    return j;
  };
  return {{"initiator", r.initiator}, {"responder", r.responder},   {"lanes", r.lanes},
          {"rtt_ms", to_json(r.rtt)}, {"single", stream(r.single)}, {"multi", stream(r.multi)}};
}

std::vector<uint8_t> encode_results(const Header& h, const std::vector<ProbeResult>& results) {
  Writer w;
  std::vector<uint8_t> head(kHeaderBytes);
  encode_header(h, head);
  w.bytes(head);
  w.u32(static_cast<uint32_t>(results.size()));
  for (const auto& r : results) {
    w.str(r.initiator);
    w.str(r.responder);
    w.u32(static_cast<uint32_t>(r.lanes));
    w.u32(r.rtt.count);
    put_f64(w, r.rtt.min_ms);
    put_f64(w, r.rtt.median_ms);
    put_f64(w, r.rtt.mean_ms);
    put_f64(w, r.rtt.p99_ms);
    put_f64(w, r.rtt.max_ms);
    w.u8(static_cast<uint8_t>((r.single ? 1 : 0) | (r.multi ? 2 : 0)));
    if (r.single) put_stream(w, *r.single);
    if (r.multi) put_stream(w, *r.multi);
  }
  return w.take();
}

std::optional<std::vector<ProbeResult>> decode_results(std::span<const uint8_t> body, std::string& error) {
  error.clear();
  In in{Reader(body), error};
  const uint32_t n = in.u32("results.count");
  if (in.ok() && n > kMaxResults) in.fail(fmt::format("results.count: {} > {}", n, kMaxResults));
  std::vector<ProbeResult> out;
  for (uint32_t i = 0; in.ok() && i < n; ++i) {
    ProbeResult r;
    r.initiator = in.str("result.initiator");
    r.responder = in.str("result.responder");
    r.lanes = static_cast<int>(in.u32("result.lanes"));
    if (in.ok() && (r.lanes < 1 || r.lanes > kMaxLanes))
      in.fail(fmt::format("result.lanes: {} outside [1, {}]", r.lanes, kMaxLanes));
    r.rtt.count = in.u32("rtt.count");
    r.rtt.min_ms = in.f64("rtt.min_ms");
    r.rtt.median_ms = in.f64("rtt.median_ms");
    r.rtt.mean_ms = in.f64("rtt.mean_ms");
    r.rtt.p99_ms = in.f64("rtt.p99_ms");
    r.rtt.max_ms = in.f64("rtt.max_ms");
    if (in.ok() &&
        !(r.rtt.min_ms <= r.rtt.median_ms && r.rtt.median_ms <= r.rtt.p99_ms && r.rtt.p99_ms <= r.rtt.max_ms))
      in.fail("rtt: min <= median <= p99 <= max does not hold");
    const uint8_t streams = in.u8("result.streams");
    if (in.ok() && streams > 3) in.fail(fmt::format("result.streams: {}", streams));
    if (in.ok() && (streams & 1)) r.single = get_stream(in, 0);
    if (in.ok() && (streams & 2)) r.multi = get_stream(in, 1);
    out.push_back(std::move(r));
  }
  if (in.ok() && in.r.left() != 0) in.fail(fmt::format("results: {} trailing bytes", in.r.left()));
  if (!in.ok()) return std::nullopt;
  return out;
}

}  // namespace geoloco::probe

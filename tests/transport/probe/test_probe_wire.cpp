// Probe protocol messages: round trips, and every field check on decode (bounds, ranges,
// truncation at every length, trailing bytes). /proc/net/snmp parsing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <cmath>

#include "transport/probe/probe.hpp"
#include "transport/probe/probe_result.hpp"
#include "transport/probe/probe_wire.hpp"
#include "transport/probe/tcp_counters.hpp"

namespace geoloco::probe {
namespace {

std::vector<uint8_t> head(const Header& h) {
  std::vector<uint8_t> b(kHeaderBytes);
  encode_header(h, b);
  return b;
}

TEST(ProbeWire, HeaderRoundTripsAndChecksEveryField) {
  Header h{MsgType::kData, 0x123456, kFlagStop, 0xABCDEFull};
  auto b = head(h);
  ASSERT_EQ(b.size(), kHeaderBytes);
  EXPECT_EQ(std::memcmp(b.data(), "GLPB", 4), 0);
  std::string err;
  auto d = decode_header(b, err);
  ASSERT_TRUE(d) << err;
  EXPECT_EQ(d->type, MsgType::kData);
  EXPECT_EQ(d->session, 0x123456u);
  EXPECT_EQ(d->flags, kFlagStop);
  EXPECT_EQ(d->seq, 0xABCDEFull);

  auto bad = [&](std::vector<uint8_t> m, const std::string& field) {
    std::string e;
    EXPECT_FALSE(decode_header(m, e));
    EXPECT_EQ(e.rfind(field, 0), 0u) << e;
  };
  bad(std::vector<uint8_t>(b.begin(), b.end() - 1), "size");
  auto m = b;
  m[0] ^= 1;
  bad(m, "magic");
  m = b;
  m[4] = 2;
  bad(m, "version");
  m = b;
  m[6] = 0;
  bad(m, "type");
  m = b;
  m[6] = 10;
  bad(m, "type");
  m = b;
  m[12] = 2;
  bad(m, "flags");
}

TEST(ProbeWire, RoundOfKeepsSessionCommandAndSeqApart) {
  EXPECT_EQ(round_of(0, 0, 0), 0u);
  EXPECT_NE(round_of(1, 0, 0), round_of(0, 1, 0));
  EXPECT_NE(round_of(0, 1, 0), round_of(0, 0, 1));
  EXPECT_EQ(round_of(kMaxSession, kMaxCommands, kMaxSeq), ~0ull);
  EXPECT_EQ(round_of(2, 3, 4), (2ull << 40) | (3ull << 24) | 4);
}

TEST(ProbeWire, PingPhaseRangesAndTruncation) {
  auto msg = encode_ping_phase({MsgType::kPingPhase, 0, 0, 0}, {50, 5, 64});
  std::string err;
  auto p = decode_ping_phase(body_of(msg), err);
  ASSERT_TRUE(p) << err;
  EXPECT_EQ(p->count, 50u);
  EXPECT_EQ(p->warmup, 5u);
  EXPECT_EQ(p->bytes, 64u);
  for (size_t n = kHeaderBytes; n < msg.size(); ++n)
    EXPECT_FALSE(decode_ping_phase(body_of(std::span<const uint8_t>(msg.data(), n)), err)) << n;
  auto extra = msg;
  extra.push_back(0);
  EXPECT_FALSE(decode_ping_phase(body_of(extra), err));
  EXPECT_NE(err.find("trailing"), std::string::npos) << err;
  for (PingPhase bad : {PingPhase{0, 0, 64}, PingPhase{kMaxPings + 1, 0, 64}, PingPhase{1, kMaxPings + 1, 64},
                        PingPhase{1, 0, kHeaderBytes - 1}, PingPhase{1, 0, kMaxPingBytes + 1}}) {
    EXPECT_FALSE(decode_ping_phase(body_of(encode_ping_phase({}, bad)), err)) << bad.count << " " << bad.bytes;
  }
}

TEST(ProbeWire, StreamPhaseRanges) {
  StreamPhase s{1, -1, 1 << 20, 8, 0.25};
  auto msg = encode_stream_phase({MsgType::kStream, 3, 0, 1}, s);
  std::string err;
  auto d = decode_stream_phase(body_of(msg), err);
  ASSERT_TRUE(d) << err;
  EXPECT_EQ(d->phase, 1u);
  EXPECT_EQ(d->lane, -1);
  EXPECT_EQ(d->message_bytes, 1u << 20);
  EXPECT_EQ(d->window, 8u);
  EXPECT_EQ(d->omit_s, 0.25);
  for (size_t n = kHeaderBytes; n < msg.size(); ++n)
    EXPECT_FALSE(decode_stream_phase(body_of(std::span<const uint8_t>(msg.data(), n)), err)) << n;
  auto check_bad = [&](StreamPhase b, const std::string& what) {
    std::string e;
    EXPECT_FALSE(decode_stream_phase(body_of(encode_stream_phase({}, b)), e)) << what;
    EXPECT_NE(e.find(what), std::string::npos) << e;
  };
  check_bad({kMaxPhases, 0, 1 << 20, 8, 0}, "phase");
  check_bad({0, -2, 1 << 20, 8, 0}, "lane");
  check_bad({0, 0, kMinMessageBytes - 1, 8, 0}, "message_bytes");
  check_bad({0, 0, kMaxMessageBytes + 1, 8, 0}, "message_bytes");
  check_bad({0, 0, 1 << 20, 0, 0}, "window");
  check_bad({0, 0, 1 << 20, kMaxWindow + 1, 0}, "window");
  check_bad({0, 0, 1 << 20, 8, -1}, "omit_s");
  check_bad({0, 0, 1 << 20, 8, std::nan("")}, "omit_s");
}

TEST(ProbeWire, ReportRoundTripAndConsistency) {
  StreamReport r{1, 100, 400 << 20, 396 << 20, 4.5, 4.9, 0.4, true};
  auto msg = encode_report({MsgType::kReport, 0, 0, 2}, r);
  std::string err;
  auto d = decode_report(body_of(msg), err);
  ASSERT_TRUE(d) << err;
  EXPECT_EQ(d->messages, 100u);
  EXPECT_EQ(d->counted_bytes, 396u << 20);
  EXPECT_EQ(d->counted_s, 4.5);
  EXPECT_TRUE(d->coarse);
  EXPECT_NEAR(report_gbps(*d), (396 << 20) * 8.0 / 4.5 / 1e9, 1e-12);
  for (size_t n = kHeaderBytes; n < msg.size(); ++n)
    EXPECT_FALSE(decode_report(body_of(std::span<const uint8_t>(msg.data(), n)), err)) << n;
  StreamReport more = r;
  more.counted_bytes = r.bytes + 1;
  EXPECT_FALSE(decode_report(body_of(encode_report({}, more)), err));
  StreamReport inf = r;
  inf.counted_s = std::numeric_limits<double>::infinity();
  EXPECT_FALSE(decode_report(body_of(encode_report({}, inf)), err));
  EXPECT_NE(err.find("counted_s"), std::string::npos) << err;
}

ProbeResult sample_result() {
  ProbeResult r;
  r.initiator = "west";
  r.responder = "east";
  r.lanes = 4;
  r.rtt = {50, 39.9, 40.5, 40.6, 41.2, 42.0};
  StreamResult s;
  s.connections = 1;
  s.lane = 0;
  s.message_bytes = 4 << 20;
  s.window = 8;
  s.receiver = {0, 40, 40ull << 22, 36ull << 22, 4.0, 4.6, 0.6};
  s.gbps = report_gbps(s.receiver);
  s.sender_s = 4.7;
  s.sender_gbps = 0.29;
  s.retransmits = Retransmits{12, 100000};
  r.single = s;
  s.connections = 4;
  s.lane = -1;
  s.retransmits.reset();
  r.multi = s;
  return r;
}

TEST(ProbeWire, ResultsRoundTripExactlyAndRejectEveryTruncation) {
  auto r = sample_result();
  auto msg = encode_results({MsgType::kResult, 7, 0, 3}, {r, r});
  std::string err;
  auto d = decode_results(body_of(msg), err);
  ASSERT_TRUE(d) << err;
  ASSERT_EQ(d->size(), 2u);
  const auto& x = (*d)[1];
  EXPECT_EQ(x.initiator, "west");
  EXPECT_EQ(x.responder, "east");
  EXPECT_EQ(x.lanes, 4);
  EXPECT_EQ(x.rtt.median_ms, 40.5);
  EXPECT_EQ(x.rtt.p99_ms, 41.2);
  ASSERT_TRUE(x.single && x.multi);
  EXPECT_EQ(x.single->gbps, r.single->gbps);
  EXPECT_EQ(x.single->lane, 0);
  EXPECT_EQ(x.multi->lane, -1);
  EXPECT_EQ(x.multi->connections, 4);
  ASSERT_TRUE(x.single->retransmits);
  EXPECT_EQ(x.single->retransmits->retrans_segs, 12u);
  EXPECT_FALSE(x.multi->retransmits);
  EXPECT_EQ(to_json(x), to_json(r));
  EXPECT_TRUE(to_json(x)["multi"]["retransmits"].is_null());
  EXPECT_NEAR(to_json(x)["single"]["retransmits"]["pct"].get<double>(), 100.0 * 12 / 100012, 1e-12);
  for (size_t n = kHeaderBytes; n < msg.size(); ++n)
    EXPECT_FALSE(decode_results(body_of(std::span<const uint8_t>(msg.data(), n)), err)) << n;
  auto extra = msg;
  extra.push_back(1);
  EXPECT_FALSE(decode_results(body_of(extra), err));

  auto bad = r;
  bad.rtt.p99_ms = 1.0;  // below the median
  EXPECT_FALSE(decode_results(body_of(encode_results({}, {bad})), err));
  EXPECT_NE(err.find("rtt"), std::string::npos) << err;
  bad = r;
  bad.lanes = 0;
  EXPECT_FALSE(decode_results(body_of(encode_results({}, {bad})), err));
  bad = r;
  bad.initiator = std::string(65, 'x');
  EXPECT_FALSE(decode_results(body_of(encode_results({}, {bad})), err));
  EXPECT_NE(err.find("initiator"), std::string::npos) << err;
  // A count beyond the limit is refused before anything is read.
  std::vector<uint8_t> many = head({MsgType::kShare, 0, 0, 0});
  for (int i = 0; i < 4; ++i) many.push_back(0xFF);
  EXPECT_FALSE(decode_results(body_of(many), err));
  EXPECT_NE(err.find("count"), std::string::npos) << err;
}

constexpr const char* kSnmp =
    "Ip: Forwarding DefaultTTL InReceives\n"
    "Ip: 1 64 1000\n"
    "Tcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens PassiveOpens AttemptFails EstabResets CurrEstab InSegs "
    "OutSegs RetransSegs InErrs OutRsts InCsumErrors\n"
    "Tcp: 1 200 120000 -1 77 41 2 9 3 123456 654321 42 0 17 0\n"
    "Udp: InDatagrams NoPorts\n"
    "Udp: 5 6\n";

TEST(TcpCounters, ParsesOutAndRetransSegsByColumnName) {
  auto c = parse_snmp(kSnmp);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->out_segs, 654321u);
  EXPECT_EQ(c->retrans_segs, 42u);
  EXPECT_FALSE(parse_snmp(""));
  EXPECT_FALSE(parse_snmp("Tcp: OutSegs\nTcp: 5\n"));                // no RetransSegs column
  EXPECT_FALSE(parse_snmp("Tcp: OutSegs RetransSegs\nTcp: 5\n"));    // ragged
  EXPECT_FALSE(parse_snmp("Tcp: OutSegs RetransSegs\nTcp: 5 x\n"));  // not a number
  EXPECT_FALSE(parse_snmp("Tcp: OutSegs RetransSegs\n"));            // no values
  EXPECT_FALSE(read_tcp_counters("/nonexistent/snmp"));
  // This machine (Linux): the real file parses.
  EXPECT_TRUE(read_tcp_counters());
}

}  // namespace
}  // namespace geoloco::probe

namespace geoloco::probe {
namespace {

constexpr uint64_t kM = 4 << 20;

double rate_of(const StreamReport& r) { return static_cast<double>(r.counted_bytes) / r.counted_s; }

StreamReport estimate(const std::vector<double>& t, uint32_t window, double omit, uint64_t size = kM) {
  return estimate_stream(t, std::vector<uint64_t>(t.size(), size), window, omit);
}

TEST(ProbeEstimate, EvenCompletionsGiveTheRate) {
  std::vector<double> t;
  for (int i = 0; i < 100; ++i) t.push_back(0.01 * i);
  auto r = estimate(t, 8, 0.1);
  EXPECT_NEAR(rate_of(r), kM / 0.01, 1e-6 * kM / 0.01);
  EXPECT_EQ(r.messages, 100u);
  EXPECT_EQ(r.bytes, 100 * kM);
  EXPECT_NEAR(r.omitted_s, 0.1, 1e-9);
  EXPECT_NEAR(r.first_to_last_s, 0.99, 1e-9);
}

// What UCX did with concurrent rendezvous transfers on one connection before the ramp: the
// window's messages arrive interleaved and complete together, one burst per period P.
// Counting between two single completions is off by up to a burst; the centroids are exact
// whatever the phase at which the omit and the drain cut the bursts.
TEST(ProbeEstimate, BurstsOfAWholeWindowGiveTheRateAtEveryPhase) {
  // What UCX does over TCP (measured: 16 x 1 MiB completing within 1 ms, every 0.49 s at
  // 287 Mbit/s): a window's transfers complete together, one burst per period P; the last
  // burst may be partial (the sender stopped mid-window) and completes early.
  const uint32_t W = 8;
  const double P = 0.94;  // 8 x 4 MiB at ~285 Mbit/s
  const double truth = W * kM / P;
  for (double eps : {0.0, 0.0004}) {
    for (int partial : {0, 3}) {
      std::vector<double> t;
      for (int i = 0; i < 7 * static_cast<int>(W); ++i) t.push_back(P * (1 + i / W) + eps * (i % W));
      for (int i = 0; i < partial; ++i) t.push_back(8 * P - P * (W - partial) / W + eps * i);
      for (double omit : {0.0, 0.3, 0.95, 1.0, 1.7}) {
        auto r = estimate(t, W, omit);
        EXPECT_NEAR(rate_of(r), truth, 0.002 * truth) << "omit " << omit << " eps " << eps << " partial " << partial;
      }
      // Counting between two single completions after 1 s and before the drain is off by most
      // of a burst (the bias the centroids remove).
      const size_t a = 8, b = t.size() - 1 - W;
      const double naive = (b - a) * kM / (t[b] - t[a]);
      EXPECT_GT(std::abs(naive - truth) / truth, 0.04) << partial;
    }
  }
}

TEST(ProbeEstimate, ShortStreamsGiveUpTheOmitThenGoCoarse) {
  std::vector<double> t;
  for (int i = 0; i < 32; ++i) t.push_back(0.1 * i);
  // 32 messages, window 8, omit 0: centroids of 0..7 and 16..23 (24..31 drain).
  auto r = estimate(t, 8, 0);
  EXPECT_EQ(r.counted_bytes, 16 * kM);
  EXPECT_NEAR(r.counted_s, 1.6, 1e-9);
  EXPECT_EQ(r.omitted_s, 0);
  // Omit 0.8 s: centroids of 8..15 and 16..23.
  r = estimate(t, 8, 0.8);
  EXPECT_EQ(r.counted_bytes, 8 * kM);
  EXPECT_NEAR(r.counted_s, 0.8, 1e-9);
  EXPECT_NEAR(r.omitted_s, 0.8, 1e-9);
  // Omit 1.3 s: no two windows after it: the omit goes.
  r = estimate(t, 8, 1.3);
  EXPECT_EQ(r.counted_bytes, 16 * kM);
  EXPECT_EQ(r.omitted_s, 0);
  EXPECT_FALSE(r.coarse);
  // Fewer than 3 windows: first to last, flagged coarse.
  r = estimate(t, 11, 0);
  EXPECT_TRUE(r.coarse);
  EXPECT_EQ(r.counted_bytes, 31 * kM);
  EXPECT_NEAR(r.counted_s, 3.1, 1e-9);
  EXPECT_EQ(r.messages, 32u);
  EXPECT_NEAR(r.first_to_last_s, 3.1, 1e-9);
  EXPECT_EQ(estimate({0.0}, 1, 0).counted_bytes, 0u);
  EXPECT_EQ(estimate({1.0, 1.0, 1.0}, 1, 0).counted_bytes, 0u);  // no time passed
}

}  // namespace
}  // namespace geoloco::probe

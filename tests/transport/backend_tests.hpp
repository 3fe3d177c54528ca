// Tests every backend must pass, instantiated once per backend (as UCX instantiates its tests
// per transport): test_transport_memory.cpp with MemoryCluster, test_transport_ucx.cpp with
// UcxCluster. A Cluster has `t` (transports), `infos`, `peers_of(i)`, `connect(i)`,
// `connect_all()` and `kUcx`.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "tests/support/threads.hpp"
#include "tests/transport/test_util.hpp"

namespace geoloco::transport::test {

template <class C>
class BackendTest : public ::testing::Test {};
TYPED_TEST_SUITE_P(BackendTest);

template <class C>
void exchange_all_sizes(int lanes) {
  const uint64_t chunk = 64 * 1024;
  std::vector<TransportConfig> cfgs(3, small_config(lanes, chunk));
  C c(cfgs, {ident("alpha"), ident("beta"), ident("gamma")});
  for (auto& e : c.connect_all()) ASSERT_EQ(e, "");
  const std::vector<size_t> sizes = {0, 1, chunk - 1, chunk, chunk + 1, (5u << 20) + 3};
  // Every ordered pair (i -> j) sends every size; round = size index, shard = sender index.
  struct Xfer {
    size_t from, to, si;
    std::vector<uint8_t> data;
    OpHandle s, r;
  };
  std::vector<Xfer> xs;
  for (size_t i = 0; i < 3; ++i)
    for (size_t j = 0; j < 3; ++j)
      if (i != j)
        for (size_t si = 0; si < sizes.size(); ++si)
          xs.push_back(Xfer{i, j, si, pattern(sizes[si], static_cast<uint32_t>(100 * i + 10 * j + si)), {}, {}});
  for (auto& x : xs) {
    int to = c.t[x.from]->peer_index(c.infos[x.to].site, 0);
    int from = c.t[x.to]->peer_index(c.infos[x.from].site, 0);
    // 16 guard bytes past the transfer: never written.
    x.r = c.t[x.to]->recv(from, FrameKind::kPseudoGradient, x.si, static_cast<uint32_t>(x.from),
                          std::vector<uint8_t>(x.data.size() + 16, 0xAB));
    x.s = c.t[x.from]->send(to, FrameKind::kPseudoGradient, x.si, static_cast<uint32_t>(x.from), P(x.data));
  }
  std::vector<uint64_t> sent(3, 0);
  for (auto& x : xs) {
    ASSERT_TRUE(x.s.wait_for(std::chrono::seconds(20))) << "send timed out";
    ASSERT_TRUE(x.r.wait_for(std::chrono::seconds(20))) << "recv timed out";
    EXPECT_EQ(x.r.bytes(), x.data.size());
    EXPECT_EQ(x.s.bytes(), x.data.size());
    const auto dest = x.r.take();
    ASSERT_EQ(dest.size(), x.data.size() + 16);
    EXPECT_TRUE(std::equal(x.data.begin(), x.data.end(), dest.begin())) << "size " << x.data.size();
    for (size_t k = x.data.size(); k < dest.size(); ++k) ASSERT_EQ(dest[k], 0xAB);
    EXPECT_TRUE(x.r.take().empty()) << "take() hands the buffer back once";
    sent[x.from] += x.data.size();
  }
  uint64_t per_pair = 0;
  for (auto s : sizes) per_pair += s;
  for (size_t i = 0; i < 3; ++i) {
    auto st = c.t[i]->stats();
    ASSERT_EQ(st.peers.size(), 2u);
    for (auto& p : st.peers) {
      EXPECT_EQ(p.bytes_sent, per_pair) << p.site;
      EXPECT_EQ(p.bytes_received, per_pair) << p.site;
      EXPECT_EQ(p.frames_rejected, 0u);
      EXPECT_EQ(p.failure, "");
    }
  }
}

TYPED_TEST_P(BackendTest, ThreeSitesExchangeOddSizesOneLane) { exchange_all_sizes<TypeParam>(1); }
TYPED_TEST_P(BackendTest, ThreeSitesExchangeOddSizesThreeLanes) { exchange_all_sizes<TypeParam>(3); }

// Small and large transfers sent before their receives exist are held and delivered.
TYPED_TEST_P(BackendTest, SendBeforeRecvIsHeldAndDelivered) {
  for (uint64_t eager : {uint64_t{0}, uint64_t{8} << 20}) {
    const uint64_t chunk = 256 * 1024;
    std::vector<TransportConfig> cfgs(2, small_config(2, chunk));
    for (auto& cfg : cfgs) cfg.eager_bytes = eager;
    TypeParam c(cfgs, {ident("a"), ident("b")});
    for (auto& e : c.connect_all()) ASSERT_EQ(e, "");
    auto small = pattern(100, 1), big = pattern(3 * chunk + 7, 2);
    // (A rendezvous send completes only once the receiver pulls the data, so do not wait yet.)
    auto s1 = c.t[0]->send(0, FrameKind::kControl, 1, 0, P(small));
    auto s2 = c.t[0]->send(0, FrameKind::kGlobalState, 1, 0, P(big));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    auto r2 = c.t[1]->recv(0, FrameKind::kGlobalState, 1, 0, big.size());
    auto r1 = c.t[1]->recv(0, FrameKind::kControl, 1, 0, size_t{100});
    r1.wait();
    r2.wait();
    s1.wait();
    s2.wait();
    EXPECT_EQ(r1.take(), small);
    EXPECT_EQ(r2.take(), big);
    const auto st = c.t[1]->stats().peers.at(0);
    if (eager >= big.size()) {
      EXPECT_EQ(st.frames_received_rndv, 0u);
    }
    EXPECT_EQ(st.frames_received, 1u + 4u);
  }
}

// A sender running ahead of the receiver sends eagerly only while its eager window (4 x
// eager_bytes, credited back as the receiver takes the messages) has room; the receiver parks
// at most the window, nothing fails, and once everything is received the window is whole.
TYPED_TEST_P(BackendTest, EagerWindowBoundsWhatARunawaySenderParks) {
  const uint64_t chunk = 1 << 20;
  std::vector<TransportConfig> cfgs(2, small_config(1, chunk));
  for (auto& cfg : cfgs) cfg.eager_bytes = 2 * chunk;  // window 8 MiB
  TypeParam c(cfgs, {ident("a"), ident("b")});
  for (auto& e : c.connect_all()) ASSERT_EQ(e, "");
  const int n = 12;
  const auto data = pattern(chunk, 5);
  std::vector<SendHandle> sends;
  for (int i = 0; i < n; ++i) sends.push_back(c.t[0]->send(0, FrameKind::kPseudoGradient, uint64_t(i), 0, P(data)));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // all sent (or announced) before any recv
  auto st = c.t[0]->stats().peers.at(0);
  EXPECT_EQ(st.messages_sent_eager, 8u);
  EXPECT_EQ(st.eager_bytes_outstanding, 8 * chunk);
  for (int i = 0; i < n; ++i) {
    auto r = c.t[1]->recv(0, FrameKind::kPseudoGradient, uint64_t(i), 0, chunk);
    r.wait();
    EXPECT_EQ(r.take(), data);
  }
  for (auto& s : sends) ASSERT_TRUE(s.wait_for(std::chrono::seconds(20)));
  EXPECT_EQ(c.t[1]->stats().peers.at(0).frames_received_rndv, 4u);  // the 4 beyond the window
  for (int i = 0; i < 100 && c.t[0]->stats().peers.at(0).eager_bytes_outstanding > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(c.t[0]->stats().peers.at(0).eager_bytes_outstanding, 0u);
}

TYPED_TEST_P(BackendTest, ApiThreadSafetyManyThreadsManyRounds) {
  std::vector<TransportConfig> cfgs(2, small_config(2, 4096));
  TypeParam c(cfgs, {ident("a"), ident("b")});
  for (auto& e : c.connect_all()) ASSERT_EQ(e, "");
  const int kThreads = 4, kRounds = 20;
  std::atomic<int> bad{0};
  geoloco::test::run_ranks(kThreads, [&](int t) {
    for (int r = 0; r < kRounds; ++r) {
      auto data = pattern(1000 + 997 * r, t * 1000 + r);
      auto rh = c.t[1]->recv(0, FrameKind::kPseudoGradient, r, t, data.size());
      auto sh = c.t[0]->send(0, FrameKind::kPseudoGradient, r, t, P(data));
      sh.wait();
      rh.wait();
      if (rh.take() != data) ++bad;
    }
  });
  EXPECT_EQ(bad.load(), 0);
}

TYPED_TEST_P(BackendTest, DuplicateRecvAndApiMisuseFailCleanly) {
  std::vector<TransportConfig> cfgs(2, small_config());
  TypeParam c(cfgs, {ident("a"), ident("b")});
  auto early = c.t[1]->recv(0, FrameKind::kControl, 5, 0, size_t{10});
  EXPECT_TRUE(contains(error_of(early), "before connect() succeeded")) << error_of(early);
  for (auto& e : c.connect_all()) ASSERT_EQ(e, "");
  auto r1 = c.t[1]->recv(0, FrameKind::kControl, 5, 0, size_t{10});
  auto r2 = c.t[1]->recv(0, FrameKind::kControl, 5, 0, size_t{10});
  EXPECT_TRUE(contains(error_of(r2), "already posted or completed")) << error_of(r2);
  auto bad_peer = c.t[1]->recv(7, FrameKind::kControl, 5, 0, size_t{10});
  EXPECT_TRUE(contains(error_of(bad_peer), "no peer with index 7"));
  auto credit = c.t[1]->recv(0, FrameKind::kCredit, 5, 0, size_t{10});
  EXPECT_TRUE(contains(error_of(credit), "invalid frame kind 5"));
  auto data = pattern(10, 3);
  c.t[0]->send(0, FrameKind::kControl, 5, 0, P(data)).wait();
  r1.wait();
  EXPECT_EQ(r1.take(), data);
  EXPECT_THROW(c.t[0]->cancel(9, "no such peer"), TransportError);
}

TYPED_TEST_P(BackendTest, EmulatedRateAndDelayPaceTransfers) {
  // 8 MiB at 100 Mbit/s cannot take less than 8*8*2^20/1e8 = 0.671 s; plus 50 ms delay.
  auto cfg = small_config(1, 1 << 20);
  cfg.emulate.rate_mbit = 100;
  cfg.emulate.delay_ms = 50;
  TypeParam c({cfg, cfg}, {ident("a"), ident("b")});
  for (auto& e : c.connect_all()) ASSERT_EQ(e, "");
  auto data = pattern(8 << 20, 9);
  auto t0 = Clock::now();
  auto r = c.t[1]->recv(0, FrameKind::kPseudoGradient, 0, 0, data.size());
  c.t[0]->send(0, FrameKind::kPseudoGradient, 0, 0, P(data)).wait();
  r.wait();
  double s = since(t0);
  EXPECT_GE(s, 8.0 * 8 * (1 << 20) / 1e8 + 0.05);
  EXPECT_LT(s, 5.0);  // and it is paced, not stuck
  EXPECT_EQ(r.take(), data);
}

// The emulated delay is kept to within a few ms, not rounded up to a poll interval.
TYPED_TEST_P(BackendTest, EmulatedDelayIsNotRoundedUpToThePollInterval) {
  auto cfg = small_config(1);
  cfg.emulate.delay_ms = 20;
  TypeParam c({cfg, cfg}, {ident("a"), ident("b")});
  for (auto& e : c.connect_all()) ASSERT_EQ(e, "");
  std::vector<uint8_t> one(1, 7);
  std::vector<double> ms;
  for (uint64_t i = 0; i < 10; ++i) {
    auto r = c.t[1]->recv(0, FrameKind::kControl, i, 0, size_t{1});
    auto t0 = Clock::now();
    c.t[0]->send(0, FrameKind::kControl, i, 0, P(one)).wait();
    r.wait();
    ms.push_back(since(t0) * 1e3);
  }
  std::sort(ms.begin(), ms.end());
  EXPECT_GE(ms.front(), 20.0);
  EXPECT_LT(ms[5], 30.0) << "median one-way " << ms[5] << " ms for a 20 ms emulated delay";
}

TYPED_TEST_P(BackendTest, StatsJsonHasPerPeerCounters) {
  std::vector<TransportConfig> cfgs(2, small_config());
  TypeParam c(cfgs, {ident("a"), ident("b")});
  for (auto& e : c.connect_all()) ASSERT_EQ(e, "");
  auto x = pattern(1000, 4);
  auto r = c.t[1]->recv(0, FrameKind::kProbe, 0, 0, size_t{1000});
  c.t[0]->send(0, FrameKind::kProbe, 0, 0, P(x)).wait();
  r.wait();
  auto j = c.t[1]->stats().to_json();
  ASSERT_EQ(j["peers"].size(), 1u);
  EXPECT_EQ(j["peers"][0]["site"], "a");
  EXPECT_EQ(j["peers"][0]["bytes_received"], 1000u);
  EXPECT_EQ(j["peers"][0]["frames_received"], 1u);
  EXPECT_EQ(j["peers"][0]["frames_rejected"], 0u);
  EXPECT_EQ(j["peers"][0]["ops_cancelled"], 0u);
  EXPECT_EQ(j["gate_refused"], 0u);
  if (TypeParam::kUcx) {
    EXPECT_FALSE(c.t[1]->settings().empty());
  }
}

// send_on_lane keeps every chunk of a transfer on one lane; plain send spreads chunks
// round-robin over the active lanes. The per-lane counters show it.
TYPED_TEST_P(BackendTest, SendOnLaneUsesOnlyThatLane) {
  const uint64_t chunk = 64 * 1024;
  std::vector<TransportConfig> cfgs(2, small_config(3, chunk));
  TypeParam c(cfgs, {ident("a"), ident("b")});
  for (auto& e : c.connect_all()) ASSERT_EQ(e, "");
  ASSERT_EQ(c.t[0]->lanes(), 3);
  auto x = pattern(12 * chunk + 5, 11);
  auto r = c.t[1]->recv(0, FrameKind::kProbe, 1, 0, x.size());
  c.t[0]->send_on_lane(0, 2, FrameKind::kProbe, 1, 0, P(x)).wait();
  r.wait();
  EXPECT_EQ(r.take(), x);
  auto lanes = c.t[0]->stats().peers.at(0).lane_bytes_sent;
  ASSERT_EQ(lanes.size(), 3u);
  EXPECT_EQ(lanes[0], 0u);
  EXPECT_EQ(lanes[1], 0u);
  EXPECT_EQ(lanes[2], x.size());
  // Round-robin: 13 chunks over 3 lanes, every lane carries some.
  r = c.t[1]->recv(0, FrameKind::kProbe, 2, 0, x.size());
  c.t[0]->send(0, FrameKind::kProbe, 2, 0, P(x)).wait();
  r.wait();
  EXPECT_EQ(r.take(), x);
  lanes = c.t[0]->stats().peers.at(0).lane_bytes_sent;
  EXPECT_GE(lanes[0], 4 * chunk);
  EXPECT_GE(lanes[1], 4 * chunk);
  EXPECT_GE(lanes[2], x.size() + 4 * chunk);
  EXPECT_EQ(lanes[0] + lanes[1] + lanes[2], 2 * x.size());
  // set_active_lanes(2): plain sends use lanes 0 and 1 only; out of range is an error.
  c.t[0]->set_active_lanes(2);
  EXPECT_EQ(c.t[0]->active_lanes(), 2);
  const auto before = c.t[0]->stats().peers.at(0).lane_bytes_sent;
  r = c.t[1]->recv(0, FrameKind::kProbe, 4, 0, x.size());
  c.t[0]->send(0, FrameKind::kProbe, 4, 0, P(x)).wait();
  r.wait();
  EXPECT_EQ(r.take(), x);
  lanes = c.t[0]->stats().peers.at(0).lane_bytes_sent;
  EXPECT_EQ(lanes[2], before[2]);
  EXPECT_GE(lanes[0] - before[0], 6 * chunk);
  EXPECT_GE(lanes[1] - before[1], 6 * chunk);
  EXPECT_THROW(c.t[0]->set_active_lanes(0), TransportError);
  EXPECT_THROW(c.t[0]->set_active_lanes(4), TransportError);
  // A lane out of range fails the handle at once and leaves the peer healthy.
  for (int bad : {3, -2}) {
    auto h = c.t[0]->send_on_lane(0, bad, FrameKind::kProbe, 3, 0, P(x));
    ASSERT_TRUE(h.ready());
    EXPECT_TRUE(contains(error_of(h), "no lane")) << error_of(h);
  }
  EXPECT_EQ(c.t[0]->stats().peers.at(0).failure, "");
}

// ---- handshake refusals -------------------------------------------------------------------

template <class C>
std::pair<std::string, std::string> connect_pair(TransportConfig ca, Identity ia, TestHooks ha, TransportConfig cb,
                                                 Identity ib, TestHooks hb, TransportStats* b_stats = nullptr) {
  C c({ca, cb}, {ia, ib}, {ha, hb});
  auto errs = c.connect_all();
  if (b_stats) *b_stats = c.t[1]->stats();
  return {errs[0], errs[1]};
}

inline TransportConfig listener_cfg() {
  auto c = small_config();
  c.connect_timeout_s = 1.5;  // the refused side waits for a good peer until this deadline
  return c;
}

// "a" < "b": a dials, b listens.
TYPED_TEST_P(BackendTest, WrongKeyIsRefusedOnBothSides) {
  auto cb = listener_cfg();
  cb.psk = key_bytes("another-key-entirely-0000");
  TransportStats bs;
  auto [ea, eb] = connect_pair<TypeParam>(small_config(), ident("a"), {}, cb, ident("b"), {}, &bs);
  // The dialer detects the listener's bad MAC and fails at once, naming the peer.
  EXPECT_TRUE(contains(ea, "authentication failed")) << ea;
  EXPECT_TRUE(contains(ea, "b/0")) << ea;
  // The listener keeps waiting for a legitimate peer, then names it and the refusal.
  EXPECT_TRUE(contains(eb, "connect timed out")) << eb;
  EXPECT_TRUE(contains(eb, "a/0")) << eb;
  EXPECT_TRUE(contains(eb, "authentication failed")) << eb;
  if (TypeParam::kUcx) {
    EXPECT_GE(bs.gate_refused, 1u);
  }
}

TYPED_TEST_P(BackendTest, WrongKeyOnTheDialerIsRefusedByTheListener) {
  auto ca = small_config();
  ca.psk = key_bytes("another-key-entirely-0000");
  auto [ea, eb] = connect_pair<TypeParam>(ca, ident("a"), {}, listener_cfg(), ident("b"), {});
  EXPECT_TRUE(contains(ea, "authentication failed")) << ea;
  EXPECT_TRUE(contains(eb, "a/0")) << eb;
}

TYPED_TEST_P(BackendTest, WrongProtocolVersionIsRefused) {
  TestHooks v9;
  v9.protocol_version = 9;
  auto [ea, eb] = connect_pair<TypeParam>(small_config(), ident("a"), v9, listener_cfg(), ident("b"), {});
  EXPECT_TRUE(contains(ea, "refused by b/0")) << ea;
  EXPECT_TRUE(contains(ea, "protocol version mismatch: peer speaks 9, we speak 2")) << ea;
  EXPECT_TRUE(contains(eb, "connect timed out")) << eb;
}

TYPED_TEST_P(BackendTest, WrongConfigHashIsRefused) {
  Identity ia = ident("a");
  ia.config_hash = 0xBAD;
  auto [ea, eb] = connect_pair<TypeParam>(small_config(), ia, {}, listener_cfg(), ident("b"), {});
  EXPECT_TRUE(contains(ea, "config hash mismatch: peer 0000000000000bad, ours 0000000000c0ffee")) << ea;
  EXPECT_TRUE(contains(eb, "config hash mismatch")) << eb;
  EXPECT_TRUE(contains(eb, "a/0")) << eb;
}

TYPED_TEST_P(BackendTest, WrongRunIdIsRefused) {
  Identity ib = ident("b");
  ib.run_id = "run-2";
  auto [ea, eb] = connect_pair<TypeParam>(small_config(), ident("a"), {}, listener_cfg(), ib, {});
  EXPECT_TRUE(contains(ea, "run id mismatch")) << ea;
  EXPECT_TRUE(contains(eb, "run id mismatch")) << eb;
}

TYPED_TEST_P(BackendTest, ErrorTypesAreHandshakeAndTimeout) {
  Identity ia = ident("a");
  ia.config_hash = 1;
  TypeParam c({small_config(), listener_cfg()}, {ia, ident("b")});
  auto fb = std::async(std::launch::async, [&] { c.connect(1); });
  EXPECT_THROW(c.connect(0), HandshakeError);
  EXPECT_THROW(fb.get(), TimeoutError);
}

// One message from -> to and back, (round, shard) as given; "" or what failed.
template <class C>
std::string ping(C& c, size_t a, size_t b, uint64_t round) {
  const int to = c.t[a]->peer_index(c.infos[b].site, 0), from = c.t[b]->peer_index(c.infos[a].site, 0);
  const auto data = pattern(100000, static_cast<uint32_t>(round));
  auto r = c.t[b]->recv(from, FrameKind::kControl, round, 1, data.size());
  auto s = c.t[a]->send(to, FrameKind::kControl, round, 1, P(data));
  try {
    if (!s.wait_for(std::chrono::seconds(20)) || !r.wait_for(std::chrono::seconds(20))) return "timed out";
    s.wait();
    r.wait();
  } catch (const std::exception& e) {
    return e.what();
  }
  auto got = r.take();
  return std::equal(data.begin(), data.end(), got.begin()) ? "" : "wrong bytes";
}

TYPED_TEST_P(BackendTest, ARestartedPeerRejoinsARunningJob) {
  // alpha, beta, gamma connected; gamma dies; a new gamma joins: alpha and beta take it in
  // place of the old one (generation 2), and messages flow both ways with everyone.
  std::vector<TransportConfig> cfgs(3, small_config(2));
  TypeParam c(cfgs, {ident("alpha"), ident("beta"), ident("gamma")});
  for (auto& e : c.connect_all()) ASSERT_EQ(e, "");
  ASSERT_EQ(ping(c, 0, 2, 1), "");
  const int g_at_a = c.t[0]->peer_index("gamma", 0), g_at_b = c.t[1]->peer_index("gamma", 0);
  EXPECT_EQ(c.t[0]->generation(g_at_a), 1u);
  c.kill(2);
  // Before the joiner is up, the old gamma's operations fail (a receive posted now too).
  auto stale = c.t[0]->recv(g_at_a, FrameKind::kControl, 2, 1, 16);
  EXPECT_THROW(stale.wait(), TransportError);
  c.restart(2, 20);
  c.join(2);
  EXPECT_EQ(c.t[0]->generation(g_at_a), 2u);
  EXPECT_EQ(c.t[1]->generation(g_at_b), 2u);
  EXPECT_EQ(c.t[2]->generation(c.t[2]->peer_index("alpha", 0)), 1u);
  // Both directions, with both running peers, on fresh keys and on a key used before the crash.
  EXPECT_EQ(ping(c, 0, 2, 3), "");
  EXPECT_EQ(ping(c, 2, 0, 4), "");
  EXPECT_EQ(ping(c, 1, 2, 5), "");
  EXPECT_EQ(ping(c, 2, 1, 1), "");
  EXPECT_EQ(ping(c, 0, 1, 6), "");  // the others' connection was never touched
  EXPECT_EQ(c.t[0]->generation(c.t[0]->peer_index("beta", 0)), 1u);
}

TYPED_TEST_P(BackendTest, AJoinerGoesOnWithThePeersItReaches) {
  // gamma and beta both die; only gamma comes back: its join returns at the deadline with
  // alpha connected and beta failed, naming why.
  std::vector<TransportConfig> cfgs(3, small_config(1));
  TypeParam c(cfgs, {ident("alpha"), ident("beta"), ident("gamma")});
  for (auto& e : c.connect_all()) ASSERT_EQ(e, "");
  c.kill(1);
  c.kill(2);
  c.restart(2, 2.0);
  c.join(2);
  EXPECT_EQ(ping(c, 2, 0, 1), "");
  const int beta = c.t[2]->peer_index("beta", 0);
  EXPECT_EQ(c.t[2]->generation(beta), 1u);  // the API is open; beta's channel failed
  auto r = c.t[2]->recv(beta, FrameKind::kControl, 1, 1, 16);
  try {
    r.wait();
    ADD_FAILURE() << "a receive from an unreachable peer succeeded";
  } catch (const TransportError& e) {
    EXPECT_NE(std::string(e.what()).find("not reachable when joining"), std::string::npos) << e.what();
  }
}

TYPED_TEST_P(BackendTest, ALinkThatTimedOutBetweenLiveProcessesIsRedialed) {
  // alpha and beta, both alive, lose every frame between them for a while (a cut longer than
  // the transfer timeout): their receives time out and both fail the connection. Once the
  // link is back, redial() (on both; only the side that dials does anything) connects them
  // again: generation 2 on both sides, messages flow both ways, and gamma was never touched.
  auto cut = std::make_shared<std::atomic<bool>>(false);
  TestHooks h;
  h.tamper = [cut](const FrameHeader& hd, std::span<const uint8_t> p) -> std::vector<TamperedFrame> {
    if (cut->load()) return {};
    return {{encoded(hd), {p.begin(), p.end()}}};
  };
  auto cfg = small_config(2);
  cfg.transfer_timeout_s = 1;
  TypeParam c({cfg, cfg, cfg}, {ident("alpha"), ident("beta"), ident("gamma")}, {h, h, {}});
  for (auto& e : c.connect_all()) ASSERT_EQ(e, "");
  ASSERT_EQ(ping(c, 0, 1, 1), "");
  const int b_at_a = c.t[0]->peer_index("beta", 0), a_at_b = c.t[1]->peer_index("alpha", 0);
  // A redial of a connection that is up does nothing.
  c.t[0]->redial(b_at_a);
  c.t[1]->redial(a_at_b);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(c.t[0]->generation(b_at_a), 1u);
  cut->store(true);
  auto ra = c.t[0]->recv(b_at_a, FrameKind::kControl, 2, 1, 16);
  auto rb = c.t[1]->recv(a_at_b, FrameKind::kControl, 2, 1, 16);
  auto sa = c.t[0]->send(b_at_a, FrameKind::kControl, 2, 1, P(pattern(8, 1)));
  auto sb = c.t[1]->send(a_at_b, FrameKind::kControl, 2, 1, P(pattern(8, 2)));
  EXPECT_THROW(ra.wait(), TransportError);
  EXPECT_THROW(rb.wait(), TransportError);
  cut->store(false);
  const auto t0 = std::chrono::steady_clock::now();
  while ((c.t[0]->generation(b_at_a) < 2 || c.t[1]->generation(a_at_b) < 2) &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20)) {
    c.t[0]->redial(b_at_a);
    c.t[1]->redial(a_at_b);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_EQ(c.t[0]->generation(b_at_a), 2u);
  ASSERT_EQ(c.t[1]->generation(a_at_b), 2u);
  EXPECT_EQ(ping(c, 0, 1, 3), "");
  EXPECT_EQ(ping(c, 1, 0, 4), "");
  EXPECT_EQ(ping(c, 0, 1, 2), "");  // a key used on the old connection
  EXPECT_EQ(ping(c, 2, 0, 5), "");
  EXPECT_EQ(c.t[2]->generation(c.t[2]->peer_index("alpha", 0)), 1u);
  // Once up, the next redial does nothing again.
  c.t[0]->redial(b_at_a);
  c.t[1]->redial(a_at_b);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(c.t[0]->generation(b_at_a), 2u);
  EXPECT_EQ(ping(c, 1, 0, 6), "");
}

REGISTER_TYPED_TEST_SUITE_P(BackendTest, ARestartedPeerRejoinsARunningJob, AJoinerGoesOnWithThePeersItReaches,
                            ALinkThatTimedOutBetweenLiveProcessesIsRedialed, ThreeSitesExchangeOddSizesOneLane,
                            ThreeSitesExchangeOddSizesThreeLanes, SendBeforeRecvIsHeldAndDelivered,
                            EagerWindowBoundsWhatARunawaySenderParks, ApiThreadSafetyManyThreadsManyRounds,
                            DuplicateRecvAndApiMisuseFailCleanly, EmulatedRateAndDelayPaceTransfers,
                            EmulatedDelayIsNotRoundedUpToThePollInterval, StatsJsonHasPerPeerCounters,
                            SendOnLaneUsesOnlyThatLane, WrongKeyIsRefusedOnBothSides,
                            WrongKeyOnTheDialerIsRefusedByTheListener, WrongProtocolVersionIsRefused,
                            WrongConfigHashIsRefused, WrongRunIdIsRefused, ErrorTypesAreHandshakeAndTimeout);

}  // namespace geoloco::transport::test

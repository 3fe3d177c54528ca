// The in-memory backend: the backend-generic tests, then the fabric's own faults (drop,
// delay, corrupt, garbage, stall, kill, cut), each landing at an exact frame.
#include <gtest/gtest.h>

#include "tests/transport/backend_fault_tests.hpp"
#include "tests/transport/backend_tests.hpp"
#include "tests/transport/memory_cluster.hpp"

using namespace geoloco::transport;
using namespace geoloco::transport::test;
using memory::Fault;
using memory::FaultAction;

INSTANTIATE_TYPED_TEST_SUITE_P(Memory, BackendTest, MemoryCluster);
INSTANTIATE_TYPED_TEST_SUITE_P(Memory, BackendFaultTest, MemoryCluster);

namespace {

// a and b connected; b receives `n` bytes of kind pseudo_gradient round 1 from a, chunk 64 KiB.
struct Pair {
  explicit Pair(double transfer_timeout = 2, double latency = 0) : c(make(transfer_timeout, latency)) {
    for (auto& e : c->connect_all()) EXPECT_EQ(e, "");
  }
  static std::unique_ptr<MemoryCluster> make(double transfer_timeout, double) {
    auto cfg = small_config(1, 64 * 1024);
    cfg.transfer_timeout_s = transfer_timeout;
    return std::make_unique<MemoryCluster>(std::vector<TransportConfig>{cfg, cfg},
                                           std::vector<Identity>{ident("a"), ident("b")});
  }
  memory::MemoryFabric& fabric() { return c->fabric; }
  Transport& a() { return *c->t[0]; }
  Transport& b() { return *c->t[1]; }
  std::unique_ptr<MemoryCluster> c;
};

Fault from_a(FaultAction action, uint64_t nth, uint64_t count = 1) {
  Fault f;
  f.action = action;
  f.from_site = "a";
  f.kind = FrameKind::kPseudoGradient;
  f.nth = nth;
  f.count = count;
  return f;
}

}  // namespace

// A dropped chunk: the receive times out after transfer_timeout_s with 3 of 4 chunks, naming
// the peer; the sender saw its chunks sent.
TEST(MemoryFaults, DroppedFrameTimesOutTheReceive) {
  Pair p(0.3);
  p.fabric().add_fault(from_a(FaultAction::kDrop, 2));
  auto x = pattern(200000, 1);
  auto r = p.b().recv(0, FrameKind::kPseudoGradient, 1, 0, x.size());
  auto s = p.a().send(0, FrameKind::kPseudoGradient, 1, 0, P(x));
  EXPECT_EQ(error_of(s), "");
  const auto e = error_of(r);
  EXPECT_TRUE(contains(e, "TimeoutError: recv pseudo_gradient round 1 shard 0 from peer a/0")) << e;
  EXPECT_TRUE(contains(e, "(3 of 4 chunks)")) << e;
  EXPECT_EQ(p.fabric().faults_applied(), 1u);
}

// A delayed chunk holds back the chunks behind it on its lane (as TCP would), so the transfer
// arrives complete, in order, late.
TEST(MemoryFaults, DelayedFrameArrivesLateAndInOrder) {
  Pair p;
  auto f = from_a(FaultAction::kDelay, 1);
  f.delay_s = 0.25;
  p.fabric().add_fault(f);
  auto x = pattern(200000, 2);
  auto t0 = Clock::now();
  auto r = p.b().recv(0, FrameKind::kPseudoGradient, 1, 0, x.size());
  p.a().send(0, FrameKind::kPseudoGradient, 1, 0, P(x));
  r.wait();
  EXPECT_GE(since(t0), 0.25);
  EXPECT_EQ(r.take(), x);
}

// A cut link (a partition that heals): from the triggering frame on, every frame a -> b of
// any kind waits for the heal, then everything arrives whole and in order; b -> a is not cut.
TEST(MemoryFaults, ACutLinkHoldsEveryFrameUntilItHeals) {
  Pair p(2);
  auto f = from_a(FaultAction::kCut, 1);
  f.to_site = "b";
  f.delay_s = 0.4;
  p.fabric().add_fault(f);
  auto x = pattern(200000, 9), y = pattern(100, 10), z = pattern(100, 11);
  const auto t0 = Clock::now();
  auto r = p.b().recv(0, FrameKind::kPseudoGradient, 1, 0, x.size());
  auto rc = p.b().recv(0, FrameKind::kControl, 2, 0, y.size());
  auto back = p.a().recv(0, FrameKind::kControl, 3, 0, z.size());
  p.a().send(0, FrameKind::kPseudoGradient, 1, 0, P(x));
  p.a().send(0, FrameKind::kControl, 2, 0, P(y));  // another kind: cut too
  p.b().send(0, FrameKind::kControl, 3, 0, P(z));  // the other direction: not cut
  back.wait();
  EXPECT_LT(since(t0), 0.3);
  EXPECT_EQ(back.take(), z);
  rc.wait();
  r.wait();
  EXPECT_GE(since(t0), 0.4);
  EXPECT_EQ(r.take(), x);
  EXPECT_EQ(rc.take(), y);
  // Healed: a frame sent now is not held.
  auto w = pattern(100, 12);
  auto r2 = p.b().recv(0, FrameKind::kControl, 4, 0, w.size());
  const auto t1 = Clock::now();
  p.a().send(0, FrameKind::kControl, 4, 0, P(w));
  r2.wait();
  EXPECT_LT(since(t1), 0.3);
  EXPECT_EQ(r2.take(), w);
}

TEST(MemoryFaults, CorruptedFrameFailsTheChecksum) {
  Pair p;
  p.fabric().add_fault(from_a(FaultAction::kCorrupt, 3));
  auto x = pattern(200000, 3);
  auto r = p.b().recv(0, FrameKind::kPseudoGradient, 1, 0, x.size());
  p.a().send(0, FrameKind::kPseudoGradient, 1, 0, P(x));
  const auto e = error_of(r);
  EXPECT_TRUE(contains(e, "FrameError: frame from peer a/0 (memory:0) rejected: checksum: mismatch at offset 131072"))
      << e;
}

// Garbage with a valid checksum passes the transport (only the layer above can tell).
TEST(MemoryFaults, GarbageWithAValidChecksumIsDeliveredAsIs) {
  Pair p;
  p.fabric().add_fault(from_a(FaultAction::kGarbage, 1));
  auto x = pattern(1000, 4);
  auto r = p.b().recv(0, FrameKind::kPseudoGradient, 1, 0, x.size());
  p.a().send(0, FrameKind::kPseudoGradient, 1, 0, P(x)).wait();
  r.wait();
  auto got = r.take();
  EXPECT_EQ(got.size(), x.size());
  EXPECT_NE(got, x);
}

// A stalled peer is alive but stuck: the receive times out (liveness from progress, not
// from the connection); resumed, it delivers what it held.
TEST(MemoryFaults, StalledPeerTimesOutAndResumes) {
  Pair p(0.3);
  p.fabric().add_fault(from_a(FaultAction::kStall, 2));
  auto x = pattern(200000, 5);
  auto r = p.b().recv(0, FrameKind::kPseudoGradient, 1, 0, x.size());
  auto s = p.a().send(0, FrameKind::kPseudoGradient, 1, 0, P(x));
  const auto e = error_of(r);
  EXPECT_TRUE(contains(e, "TimeoutError")) << e;
  EXPECT_TRUE(contains(e, "(1 of 4 chunks)")) << e;
  EXPECT_FALSE(s.ready()) << "the stalled sender is frozen";
  p.fabric().resume("a", 0);
  EXPECT_NE(error_of(s), "hang");
}

// Killed just before its 3rd frame: exactly two chunks arrived; the survivor's receive fails
// at once naming the lost peer; the dead side's own operations fail too.
TEST(MemoryFaults, KilledPeerFailsTheSurvivorAtTheChosenFrame) {
  Pair p(30);
  p.fabric().add_fault(from_a(FaultAction::kKill, 3));
  auto x = pattern(200000, 6);
  auto r = p.b().recv(0, FrameKind::kPseudoGradient, 1, 0, x.size());
  auto mine = p.a().recv(0, FrameKind::kControl, 1, 0, size_t{10});
  auto t0 = Clock::now();
  p.a().send(0, FrameKind::kPseudoGradient, 1, 0, P(x));
  const auto e = error_of(r);
  EXPECT_LT(since(t0), 1.0);
  EXPECT_TRUE(contains(e,
                       "TransportError: connection to peer a/0 (memory:0) lost (lane 0): killed (memory fabric fault, "
                       "before sending pseudo_gradient round 1 offset 131072)"))
      << e;
  EXPECT_EQ(p.b().stats().peers.at(0).bytes_received, 2u * 64 * 1024);
  EXPECT_TRUE(contains(error_of(mine), "transport a/0 killed")) << error_of(mine);
}

// kill() from the test at any moment: peers' pending operations fail naming it.
TEST(MemoryFaults, KillNowFailsPendingOperationsOfEveryPeer) {
  auto cfg = small_config();
  cfg.transfer_timeout_s = 30;
  MemoryCluster c({cfg, cfg, cfg}, {ident("a"), ident("b"), ident("c")});
  for (auto& e : c.connect_all()) ASSERT_EQ(e, "");
  auto rb = c.t[1]->recv(c.t[1]->peer_index("c", 0), FrameKind::kControl, 1, 0, size_t{10});
  auto ra = c.t[0]->recv(c.t[0]->peer_index("c", 0), FrameKind::kControl, 1, 0, size_t{10});
  auto ab = c.t[0]->recv(c.t[0]->peer_index("b", 0), FrameKind::kControl, 1, 0, size_t{10});
  c.fabric.kill("c", 0);
  EXPECT_TRUE(contains(error_of(rb), "connection to peer c/0 (memory:2) lost")) << error_of(rb);
  EXPECT_TRUE(contains(error_of(ra), "connection to peer c/0 (memory:2) lost")) << error_of(ra);
  EXPECT_FALSE(ab.ready()) << "a and b are unaffected";
  auto x = pattern(10, 1);
  c.t[1]->send(c.t[1]->peer_index("a", 0), FrameKind::kControl, 1, 0, P(x)).wait();
  ab.wait();
  EXPECT_EQ(ab.take(), x);
}

// The same calls give the same deliveries: a fault counted by frame lands on the same bytes.
TEST(MemoryFaults, DeliveryIsDeterministic) {
  std::vector<uint64_t> received;
  for (int run = 0; run < 3; ++run) {
    Pair p(0.3);
    p.fabric().add_fault(from_a(FaultAction::kDrop, 4, 2));
    auto x = pattern(10 * 64 * 1024, 7);
    auto r = p.b().recv(0, FrameKind::kPseudoGradient, 1, 0, x.size());
    p.a().send(0, FrameKind::kPseudoGradient, 1, 0, P(x));
    EXPECT_TRUE(contains(error_of(r), "(8 of 10 chunks)")) << error_of(r);
    received.push_back(p.b().stats().peers.at(0).bytes_received);
  }
  EXPECT_EQ(received, std::vector<uint64_t>(3, 8u * 64 * 1024));
}

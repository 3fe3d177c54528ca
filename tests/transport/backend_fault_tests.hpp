// Failure paths every backend must handle the same way: tampered frames (through the
// TestHooks tamper function), silent and departed peers, and cancellation. Instantiated per
// backend like backend_tests.hpp.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <thread>

#include "tests/transport/test_util.hpp"

namespace geoloco::transport::test {

template <class C>
class BackendFaultTest : public ::testing::Test {};
TYPED_TEST_SUITE_P(BackendFaultTest);

using Tamper = std::function<std::vector<TamperedFrame>(const FrameHeader&, std::span<const uint8_t>)>;

// Sends `n` bytes from a (with `tamper`) to b into a buffer of `dest_size`; returns b's recv
// error ("" if it succeeded, then the bytes are checked). The sender's handle must finish too.
template <class C>
std::string tampered_transfer(Tamper tamper, size_t n, size_t dest_size, double transfer_timeout = 5) {
  auto cfg = small_config(1, 64 * 1024);
  cfg.transfer_timeout_s = transfer_timeout;
  TestHooks h;
  h.tamper = std::move(tamper);
  C c({cfg, cfg}, {ident("a"), ident("b")}, {h, {}});
  for (auto& e : c.connect_all()) EXPECT_EQ(e, "");
  auto x = pattern(n, 11);
  auto r = c.t[1]->recv(0, FrameKind::kPseudoGradient, 3, 1, dest_size);
  auto s = c.t[0]->send(0, FrameKind::kPseudoGradient, 3, 1, P(x));
  const std::string err = error_of(r);
  EXPECT_NE(err, "hang");
  // The sender's handle finishes too (the receiver broke the connection): no hang.
  EXPECT_NE(error_of(s), "hang");
  if (err.empty()) {
    auto d = r.take();
    EXPECT_EQ(std::vector<uint8_t>(d.begin(), d.begin() + static_cast<std::ptrdiff_t>(n)), x);
  } else {
    EXPECT_TRUE(r.take().empty()) << "a failed receive hands nothing back";
  }
  return err;
}

inline std::vector<TamperedFrame> as_is(const FrameHeader& h, std::span<const uint8_t> p) {
  return {{encoded(h), {p.begin(), p.end()}}};
}

TYPED_TEST_P(BackendFaultTest, UntamperedTransferSucceeds) {
  EXPECT_EQ(tampered_transfer<TypeParam>(as_is, 200000, 200000), "");
}

TYPED_TEST_P(BackendFaultTest, BadMagicIsRejected) {
  auto e = tampered_transfer<TypeParam>(
      [](const FrameHeader& h, std::span<const uint8_t> p) {
        FrameHeader m = h;
        if (h.offset == 65536) m.magic = 0xDEADBEEF;
        return as_is(m, p);
      },
      200000, 200000);
  EXPECT_TRUE(contains(e, "FrameError: frame from peer a/0")) << e;
  EXPECT_TRUE(contains(e, "magic: got 0xdeadbeef")) << e;
}

TYPED_TEST_P(BackendFaultTest, ShortHeaderIsRejected) {
  auto e = tampered_transfer<TypeParam>(
      [](const FrameHeader& h, std::span<const uint8_t> p) {
        auto hb = encoded(h);
        hb.resize(20);
        return std::vector<TamperedFrame>{{hb, {p.begin(), p.end()}}};
      },
      1000, 1000);
  EXPECT_TRUE(contains(e, "header: 20 bytes, expected 56")) << e;
}

TYPED_TEST_P(BackendFaultTest, TransferLargerThanTheDestinationIsRejectedBeforeAnyCopy) {
  auto e = tampered_transfer<TypeParam>(nullptr, 200000, 100000);
  EXPECT_TRUE(contains(e, "total_length: 200000 exceeds the receive buffer of 100000 bytes")) << e;
}

// A peer may only return eager bytes it was sent; a credit frame carries nothing else;
// unknown flags are protocol errors. Each fails the connection naming the cause.
TYPED_TEST_P(BackendFaultTest, ForgedOrMalformedCreditsAndUnknownFlagsAreRejected) {
  auto credit = [](uint64_t bytes, uint64_t total) {
    FrameHeader c;
    c.kind = static_cast<uint16_t>(FrameKind::kCredit);
    c.round = bytes;
    c.total_length = total;
    return c;
  };
  auto e = tampered_transfer<TypeParam>(
      [&](const FrameHeader& h, std::span<const uint8_t> p) {
        return std::vector<TamperedFrame>{{encoded(credit(1 << 20, 0)), {}}, {encoded(h), {p.begin(), p.end()}}};
      },
      1000, 1000);
  EXPECT_TRUE(contains(e, "credit frame returns 1048576 eager bytes, only 0 are outstanding")) << e;
  e = tampered_transfer<TypeParam>(
      [&](const FrameHeader& h, std::span<const uint8_t> p) {
        return std::vector<TamperedFrame>{{encoded(credit(0, 5)), {}}, {encoded(h), {p.begin(), p.end()}}};
      },
      1000, 1000);
  EXPECT_TRUE(contains(e, "credit frame: offset, length, total_length, shard and flags must be 0")) << e;
  e = tampered_transfer<TypeParam>(
      [](const FrameHeader& h, std::span<const uint8_t> p) {
        FrameHeader m = h;
        m.flags = 0x10;
        return as_is(m, p);
      },
      1000, 1000);
  EXPECT_TRUE(contains(e, "flags: got 0x10, unknown bits set")) << e;
}

TYPED_TEST_P(BackendFaultTest, AbsurdTotalLengthIsRejected) {
  auto e = tampered_transfer<TypeParam>(
      [](const FrameHeader& h, std::span<const uint8_t> p) {
        FrameHeader m = h;
        m.total_length = 1ull << 62;
        return as_is(m, p);
      },
      1000, 1000);
  EXPECT_TRUE(contains(e, "total_length: got 4611686018427387904, exceeds the limit")) << e;
}

TYPED_TEST_P(BackendFaultTest, OffsetOutsideTheTransferIsRejected) {
  auto e = tampered_transfer<TypeParam>(
      [](const FrameHeader& h, std::span<const uint8_t> p) {
        FrameHeader m = h;
        m.offset = 10 * 65536;
        return as_is(m, p);
      },
      100000, 100000);
  EXPECT_TRUE(contains(e, "offset: got 655360")) << e;
}

TYPED_TEST_P(BackendFaultTest, ReplayedChunkIsRejected) {
  auto e = tampered_transfer<TypeParam>(
      [](const FrameHeader& h, std::span<const uint8_t> p) {
        auto v = as_is(h, p);
        if (h.offset == 0) v.push_back(v[0]);
        return v;
      },
      200000, 200000);
  EXPECT_TRUE(contains(e, "duplicate chunk at offset 0 (replay)")) << e;
}

TYPED_TEST_P(BackendFaultTest, TruncatedChunkIsRejected) {
  auto e = tampered_transfer<TypeParam>(
      [](const FrameHeader& h, std::span<const uint8_t> p) {
        std::vector<uint8_t> body(p.begin(), p.end());
        if (h.offset == 65536) body.pop_back();
        return std::vector<TamperedFrame>{{encoded(h), body}};
      },
      200000, 200000);
  EXPECT_TRUE(contains(e, "header says 65536 bytes, message carried 65535")) << e;
}

TYPED_TEST_P(BackendFaultTest, CorruptedPayloadFailsTheChecksum) {
  auto e = tampered_transfer<TypeParam>(
      [](const FrameHeader& h, std::span<const uint8_t> p) {
        std::vector<uint8_t> body(p.begin(), p.end());
        if (h.offset == 131072) body[100] ^= 0x01;
        return std::vector<TamperedFrame>{{encoded(h), body}};
      },
      200000, 200000);
  EXPECT_TRUE(contains(e, "checksum: mismatch at offset 131072")) << e;
}

TYPED_TEST_P(BackendFaultTest, MissingChunkTimesOut) {
  auto t0 = Clock::now();
  auto e = tampered_transfer<TypeParam>(
      [](const FrameHeader& h, std::span<const uint8_t> p) {
        if (h.offset == 65536) return std::vector<TamperedFrame>{};
        return as_is(h, p);
      },
      200000, 200000, /*transfer_timeout=*/0.5);
  EXPECT_TRUE(contains(e, "TimeoutError")) << e;
  EXPECT_TRUE(contains(e, "(3 of 4 chunks)")) << e;
  EXPECT_LT(since(t0), 5.0);
}

// ---- silent and departed peers ------------------------------------------------------------

TYPED_TEST_P(BackendFaultTest, RecvWithNoSenderTimesOutNamingThePeer) {
  auto cfg = small_config();
  cfg.transfer_timeout_s = 0.3;
  TypeParam c({cfg, cfg}, {ident("a"), ident("b")});
  for (auto& e : c.connect_all()) ASSERT_EQ(e, "");
  auto t0 = Clock::now();
  auto r = c.t[1]->recv(0, FrameKind::kControl, 0, 0, size_t{10});
  const std::string e = error_of(r);
  EXPECT_TRUE(contains(e, "TimeoutError")) << e;
  EXPECT_TRUE(contains(e, "from peer a/0")) << e;
  EXPECT_GE(since(t0), 0.3);
  EXPECT_LT(since(t0), 2.0);
  // The peer is broken from now on: later operations fail at once with the same reason.
  EXPECT_TRUE(contains(error_of(c.t[1]->recv(0, FrameKind::kControl, 1, 0, size_t{10})), "TimeoutError"));
}

TYPED_TEST_P(BackendFaultTest, PeerShutdownFailsPendingOperations) {
  auto cfg = small_config();
  TypeParam c({cfg, cfg}, {ident("a"), ident("b")});
  for (auto& e : c.connect_all()) ASSERT_EQ(e, "");
  auto r = c.t[1]->recv(0, FrameKind::kPseudoGradient, 0, 0, size_t{1} << 20);
  auto t0 = Clock::now();
  c.t[0].reset();
  EXPECT_TRUE(contains(error_of(r), "TransportError")) << error_of(r);
  EXPECT_LT(since(t0), cfg.transfer_timeout_s + 1.0);
  auto st = c.t[1]->stats();
  EXPECT_TRUE(contains(st.peers[0].failure, "a/0")) << st.peers[0].failure;
}

// A peer that sends and then shuts down at once: what it sent (over every lane, so the
// goodbye on one lane may overtake data on another) still completes the receive waiting for
// it; only then does the peer count as gone.
TYPED_TEST_P(BackendFaultTest, WhatAPeerSentBeforeShuttingDownIsDelivered) {
  auto cfg = small_config(3, 64 * 1024);
  for (int trial = 0; trial < 5; ++trial) {
    TypeParam c({cfg, cfg}, {ident("a"), ident("b")});
    for (auto& e : c.connect_all()) ASSERT_EQ(e, "");
    const auto x = pattern(40 * 64 * 1024 + 3, static_cast<uint32_t>(trial));  // 41 chunks over 3 lanes
    auto r = c.t[1]->recv(0, FrameKind::kControl, 1, 0, x.size());
    c.t[0]->send(0, FrameKind::kControl, 1, 0, P(x)).wait();
    c.t[0].reset();
    ASSERT_EQ(error_of(r), "") << "trial " << trial;
    EXPECT_EQ(r.take(), x);
    // And then it is gone, cleanly.
    const std::string later = error_of(c.t[1]->recv(0, FrameKind::kControl, 2, 0, size_t{10}));
    EXPECT_TRUE(contains(later, "peer a/0")) << later;
    EXPECT_TRUE(contains(later, "shut down")) << later;
  }
}

// A message that arrived whole before its sender shut down is delivered to a receive posted
// after the shutdown (the race the loop can lose: frames and goodbye in one progress pass,
// the receive's post in the next); a partial one, or any other key, fails "shut down".
TYPED_TEST_P(BackendFaultTest, WhatArrivedBeforeAShutdownIsDeliveredToALaterRecv) {
  auto cfg = small_config(3, 64 * 1024);
  TypeParam c({cfg, cfg}, {ident("a"), ident("b")});
  for (auto& e : c.connect_all()) ASSERT_EQ(e, "");
  const auto x = pattern(5 * 64 * 1024 + 7, 3), y = pattern(100, 4);
  c.t[0]->send(0, FrameKind::kControl, 1, 0, P(x)).wait();
  c.t[0]->send(0, FrameKind::kControl, 4, 0, P(y)).wait();
  // Both went out eagerly (under eager_bytes): they wait at b, unposted, and the goodbye
  // comes after them.
  c.t[0].reset();
  // A key a never sent fails once b has taken in the shutdown; that shows it has.
  const std::string other = error_of(c.t[1]->recv(0, FrameKind::kControl, 2, 0, size_t{10}));
  EXPECT_TRUE(contains(other, "peer a/0")) << other;
  EXPECT_TRUE(contains(other, "shut down")) << other;
  auto r = c.t[1]->recv(0, FrameKind::kControl, 1, 0, x.size());
  ASSERT_EQ(error_of(r), "");
  EXPECT_EQ(r.take(), x);
  auto r4 = c.t[1]->recv(0, FrameKind::kControl, 4, 0, y.size());
  ASSERT_EQ(error_of(r4), "");
  EXPECT_EQ(r4.take(), y);
  const std::string later = error_of(c.t[1]->recv(0, FrameKind::kControl, 3, 0, size_t{10}));
  EXPECT_TRUE(contains(later, "shut down")) << later;
  EXPECT_EQ(c.t[1]->stats().peers.at(0).frames_rejected, 0u);
}

// expire(): a decided round's late control messages (shard >= the floor) are dropped, held
// or arriving later; other shards and later rounds are untouched.
TYPED_TEST_P(BackendFaultTest, ExpiredMessagesAreDroppedHeldOrLate) {
  auto cfg = small_config();
  cfg.transfer_timeout_s = 0.3;
  TypeParam c({cfg, cfg}, {ident("a"), ident("b")});
  for (auto& e : c.connect_all()) ASSERT_EQ(e, "");
  const auto x = pattern(100, 1);
  c.t[0]->send(0, FrameKind::kControl, 5, 1000, P(x)).wait();  // held at b
  c.t[0]->send(0, FrameKind::kControl, 5, 7, P(x)).wait();     // below the shard floor: kept
  for (int i = 0; i < 100 && c.t[1]->stats().peers.at(0).frames_discarded == 0; ++i) {
    if (i == 0) c.t[1]->expire(FrameKind::kControl, 6, 1000);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  c.t[0]->send(0, FrameKind::kControl, 4, 1001, P(x)).wait();  // late: dropped on arrival
  c.t[0]->send(0, FrameKind::kControl, 6, 1000, P(x)).wait();  // a later round: kept
  auto kept = c.t[1]->recv(0, FrameKind::kControl, 5, 7, x.size());
  auto later = c.t[1]->recv(0, FrameKind::kControl, 6, 1000, x.size());
  EXPECT_EQ(error_of(kept), "");
  EXPECT_EQ(error_of(later), "");
  for (int i = 0; i < 100 && c.t[1]->stats().peers.at(0).frames_discarded < 2; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(c.t[1]->stats().peers.at(0).frames_discarded, 2u);
  EXPECT_EQ(c.t[1]->stats().peers.at(0).failure, "");
}

// ---- cancellation --------------------------------------------------------------------------

// A cancelled receive completes with CancelledError; the peer stays healthy; frames that
// arrive later for the cancelled transfer are discarded (their eager bytes credited back),
// and the same key can be received again once posted anew.
TYPED_TEST_P(BackendFaultTest, CancelledRecvFailsAloneAndLateFramesAreDiscarded) {
  auto cfg = small_config();
  TypeParam c({cfg, cfg}, {ident("a"), ident("b")});
  for (auto& e : c.connect_all()) ASSERT_EQ(e, "");
  auto r = c.t[1]->recv(0, FrameKind::kControl, 7, 0, size_t{100});
  auto other = c.t[1]->recv(0, FrameKind::kControl, 8, 0, size_t{100});
  r.cancel();
  const std::string e = error_of(r);
  EXPECT_TRUE(contains(e, "CancelledError: recv control round 7 shard 0: cancelled: by the caller (peer a/0")) << e;
  EXPECT_TRUE(r.take().empty());
  EXPECT_EQ(r.error_kind(), FailKind::kCancelled);
  // The late frame of round 7 is dropped; round 8 arrives.
  auto late = pattern(100, 1), good = pattern(100, 2);
  c.t[0]->send(0, FrameKind::kControl, 7, 0, P(late)).wait();
  c.t[0]->send(0, FrameKind::kControl, 8, 0, P(good)).wait();
  other.wait();
  EXPECT_EQ(other.take(), good);
  auto st = c.t[1]->stats().peers.at(0);
  EXPECT_EQ(st.frames_discarded, 1u);
  EXPECT_EQ(st.ops_cancelled, 1u);
  EXPECT_EQ(st.failure, "");
  for (int i = 0; i < 100 && c.t[0]->stats().peers.at(0).eager_bytes_outstanding > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(c.t[0]->stats().peers.at(0).eager_bytes_outstanding, 0u) << "discarded eager bytes are credited back";
  // Round 7 can be received again.
  auto again = c.t[1]->recv(0, FrameKind::kControl, 7, 0, size_t{100});
  c.t[0]->send(0, FrameKind::kControl, 7, 0, P(good)).wait();
  again.wait();
  EXPECT_EQ(again.take(), good);
  // Cancelling a completed operation changes nothing.
  again.cancel();
  EXPECT_EQ(again.error_kind(), FailKind::kNone);
}

// cancel(peer) completes every pending operation with that peer, sends included, and leaves
// the other peers and later operations alone.
TYPED_TEST_P(BackendFaultTest, CancelAllOfAPeerLeavesOthersAlone) {
  auto cfg = small_config(1, 64 * 1024);
  cfg.emulate.rate_mbit = 20;  // a 1 MiB send takes ~0.4 s: still under way when cancelled
  TypeParam c({cfg, cfg, cfg}, {ident("a"), ident("b"), ident("c")});
  for (auto& e : c.connect_all()) ASSERT_EQ(e, "");
  const int b = c.t[0]->peer_index("b", 0), cc = c.t[0]->peer_index("c", 0);
  auto big = pattern(1 << 20, 3);
  auto rb = c.t[0]->recv(b, FrameKind::kControl, 1, 0, size_t{10});
  auto sb = c.t[0]->send(b, FrameKind::kPseudoGradient, 1, 0, P(big));
  auto rc = c.t[0]->recv(cc, FrameKind::kControl, 1, 0, size_t{10});
  c.t[0]->cancel(b, "site b was evicted");
  EXPECT_TRUE(contains(error_of(rb), "CancelledError: recv control round 1 shard 0: cancelled: site b was evicted"))
      << error_of(rb);
  EXPECT_TRUE(
      contains(error_of(sb), "CancelledError: send pseudo_gradient round 1 shard 0: cancelled: site b was evicted"))
      << error_of(sb);
  EXPECT_FALSE(rc.ready());
  auto x = pattern(10, 4);
  const int a_at_c = c.t[2]->peer_index("a", 0);
  c.t[2]->send(a_at_c, FrameKind::kControl, 1, 0, P(x)).wait();
  rc.wait();
  EXPECT_EQ(rc.take(), x);
  // b itself is still connected: a new exchange works.
  const int a_at_b = c.t[1]->peer_index("a", 0);
  auto r2 = c.t[1]->recv(a_at_b, FrameKind::kControl, 2, 0, size_t{10});
  c.t[0]->send(b, FrameKind::kControl, 2, 0, P(x)).wait();
  r2.wait();
  EXPECT_EQ(r2.take(), x);
  EXPECT_EQ(c.t[0]->stats().peers.at(static_cast<size_t>(b)).failure, "");
}

// Cancel in the middle of a large transfer (receive and send, rendezvous chunks in flight),
// drop every handle at once, and go on: no request ever writes into memory that was
// released (the ASan build would see it), the handles complete, and the next transfer of
// the same size succeeds.
TYPED_TEST_P(BackendFaultTest, CancelMidTransferReleasesNothingUnderARequest) {
  auto cfg = small_config(2, 256 * 1024);
  cfg.eager_bytes = 0;          // every large chunk by rendezvous
  cfg.emulate.rate_mbit = 200;  // 8 MiB ~ 0.34 s
  TypeParam c({cfg, cfg}, {ident("a"), ident("b")});
  for (auto& e : c.connect_all()) ASSERT_EQ(e, "");
  const auto x = pattern(8u << 20, 5);
  for (int trial = 0; trial < 3; ++trial) {
    auto r = c.t[1]->recv(0, FrameKind::kGlobalState, trial, 0, x.size());
    auto s = c.t[0]->send(0, FrameKind::kGlobalState, trial, 0, P(x));
    auto t0 = Clock::now();
    while (c.t[1]->stats().peers.at(0).bytes_received < (static_cast<uint64_t>(trial) + 1) * (1u << 20) &&
           since(t0) < 10)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    r.cancel();
    s.cancel();
    EXPECT_TRUE(contains(error_of(r), "CancelledError")) << error_of(r);
    EXPECT_NE(error_of(s), "hang");
  }
  // Handles dropped before completion are fine too: the operations own their buffers.
  {
    auto r = c.t[1]->recv(0, FrameKind::kGlobalState, 50, 0, x.size());
    auto s = c.t[0]->send(0, FrameKind::kGlobalState, 50, 0, P(x));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    r.cancel();
    s.cancel();
  }
  auto r = c.t[1]->recv(0, FrameKind::kGlobalState, 99, 0, x.size());
  c.t[0]->send(0, FrameKind::kGlobalState, 99, 0, P(x)).wait();
  r.wait();
  EXPECT_EQ(r.take(), x);
  EXPECT_EQ(c.t[1]->stats().peers.at(0).failure, "");
}

// A handle outlives its transport: cancel() and wait() on it are harmless.
TYPED_TEST_P(BackendFaultTest, HandlesOutliveTheirTransport) {
  auto cfg = small_config();
  OpHandle r;
  {
    TypeParam c({cfg, cfg}, {ident("a"), ident("b")});
    for (auto& e : c.connect_all()) ASSERT_EQ(e, "");
    r = c.t[1]->recv(0, FrameKind::kControl, 1, 0, size_t{10});
  }
  EXPECT_TRUE(r.ready());
  EXPECT_TRUE(contains(error_of(r), "TransportError")) << error_of(r);
  r.cancel();
  EXPECT_TRUE(r.take().empty());
}

REGISTER_TYPED_TEST_SUITE_P(BackendFaultTest, UntamperedTransferSucceeds, BadMagicIsRejected, ShortHeaderIsRejected,
                            TransferLargerThanTheDestinationIsRejectedBeforeAnyCopy,
                            ForgedOrMalformedCreditsAndUnknownFlagsAreRejected, AbsurdTotalLengthIsRejected,
                            OffsetOutsideTheTransferIsRejected, ReplayedChunkIsRejected, TruncatedChunkIsRejected,
                            CorruptedPayloadFailsTheChecksum, MissingChunkTimesOut,
                            RecvWithNoSenderTimesOutNamingThePeer, PeerShutdownFailsPendingOperations,
                            WhatAPeerSentBeforeShuttingDownIsDelivered,
                            WhatArrivedBeforeAShutdownIsDeliveredToALaterRecv, ExpiredMessagesAreDroppedHeldOrLate,
                            CancelledRecvFailsAloneAndLateFramesAreDiscarded, CancelAllOfAPeerLeavesOthersAlone,
                            CancelMidTransferReleasesNothingUnderARequest, HandlesOutliveTheirTransport);

}  // namespace geoloco::transport::test

// Operation handles: completion, errors by type, take(), cancel() and its canceller.
#include <gtest/gtest.h>

#include <thread>

#include "transport/op.hpp"
#include "transport/transport_error.hpp"

using namespace geoloco::transport;

TEST(OpHandle, CompletesOnceAndHandsTheBufferBackOnce) {
  auto st = std::make_shared<detail::OpState>();
  OpHandle h(st);
  EXPECT_FALSE(h.ready());
  EXPECT_FALSE(h.wait_for(std::chrono::milliseconds(1)));
  auto buf = std::make_shared<std::vector<uint8_t>>(std::vector<uint8_t>{1, 2, 3, 4});
  std::thread t([&] { st->finish_ok(3, std::move(buf)); });
  h.wait();
  t.join();
  st->finish(FailKind::kTransport, "late", 0);  // ignored
  EXPECT_EQ(h.error_kind(), FailKind::kNone);
  EXPECT_EQ(h.bytes(), 3u);
  EXPECT_EQ(h.take(), (std::vector<uint8_t>{1, 2, 3, 4}));
  EXPECT_TRUE(h.take().empty());
}

TEST(OpHandle, EveryFailureKindThrowsItsOwnType) {
  auto check = [](FailKind k, auto type_tag) {
    auto st = std::make_shared<detail::OpState>();
    st->finish(k, "why", 0, std::make_shared<std::vector<uint8_t>>(8));
    OpHandle h(st);
    EXPECT_THROW(h.wait(), decltype(type_tag));
    EXPECT_TRUE(h.take().empty()) << "a failed operation hands nothing back";
    EXPECT_EQ(h.error_kind(), k);
  };
  check(FailKind::kFrame, FrameError("x"));
  check(FailKind::kTimeout, TimeoutError("x"));
  check(FailKind::kHandshake, HandshakeError("x"));
  check(FailKind::kCancelled, CancelledError("x"));
  check(FailKind::kTransport, TransportError("x"));
}

TEST(OpHandle, CancelCallsTheCancellerOnceAndNeverAfterCompletion) {
  auto st = std::make_shared<detail::OpState>();
  int calls = 0;
  st->set_canceller([&] { ++calls; });
  OpHandle h(st);
  h.cancel();
  h.cancel();
  EXPECT_EQ(calls, 1);
  auto done = std::make_shared<detail::OpState>();
  int late = 0;
  done->set_canceller([&] { ++late; });
  done->finish_ok(0);
  OpHandle(done).cancel();
  EXPECT_EQ(late, 0);
  OpHandle empty;
  empty.cancel();  // harmless
  EXPECT_FALSE(empty.ready());
}

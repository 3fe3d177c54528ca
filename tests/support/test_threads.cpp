// run_ranks: ranks really run at once, results come back by rank, and a failure is rethrown
// only after every rank finished -- the lowest failing rank's, whatever the timing.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>

#include "tests/support/threads.hpp"

namespace geoloco::test {
namespace {

using namespace std::chrono_literals;

TEST(RunRanks, RanksRunConcurrentlyAndReturnByRank) {
  constexpr int n = 6;
  std::atomic<int> arrived{0};
  // Each rank waits (bounded) for all others to have started: only concurrent ranks all see n.
  auto seen = run_ranks(n, [&](int r) {
    arrived.fetch_add(1);
    const auto until = std::chrono::steady_clock::now() + 5s;
    while (arrived.load() < n && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(1ms);
    return std::to_string(r) + ":" + std::to_string(arrived.load());
  });
  ASSERT_EQ(seen.size(), size_t(n));
  for (int r = 0; r < n; ++r) EXPECT_EQ(seen[size_t(r)], std::to_string(r) + ":6");
}

TEST(RunRanks, RethrowsTheLowestFailingRankAfterAllJoined) {
  std::atomic<bool> slow_done{false};
  try {
    run_ranks(4, [&](int r) {
      if (r == 3) throw std::runtime_error("rank 3 first in time");
      if (r == 1) {
        std::this_thread::sleep_for(50ms);
        throw std::logic_error("rank 1 later");
      }
      if (r == 0) {
        std::this_thread::sleep_for(200ms);
        slow_done = true;
      }
    });
    FAIL() << "nothing rethrown";
  } catch (const std::logic_error& e) {
    EXPECT_STREQ(e.what(), "rank 1 later");
  }
  EXPECT_TRUE(slow_done) << "rethrown before every rank had finished";
}

TEST(RunRanks, NoRanksIsNoWork) {
  int calls = 0;
  run_ranks(0, [&](int) { ++calls; });
  EXPECT_EQ(calls, 0);
}

}  // namespace
}  // namespace geoloco::test

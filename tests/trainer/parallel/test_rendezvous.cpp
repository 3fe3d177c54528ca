#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "tests/trainer/parallel/test_util.hpp"
#include "trainer/parallel/errors.hpp"
#include "trainer/parallel/rendezvous.hpp"

namespace geoloco::parallel {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;
using testing::options;

TEST(Rendezvous, AllRanksArriveInAnyOrder) {
  const int port = test::fresh_port();
  test::run_ranks(4, [&](int r) {
    // Rank 0 (the server) arrives last: the others must keep retrying.
    std::this_thread::sleep_for(std::chrono::milliseconds(r == 0 ? 300 : 20 * r));
    Rendezvous rv(options("paris", r, 4, port, 5s));
    auto v = rv.store().get(fmt::format("rdzv/rank/{}", (r + 1) % 4));
    EXPECT_FALSE(v.empty());
    // Rank 0 owns the server: it leaves only after everyone else has finished with it.
    if (r != 0) {
      rv.store().set(fmt::format("leaving/{}", r), {});
    } else {
      rv.store().wait({"leaving/1", "leaving/2", "leaving/3"}, 5s);
    }
  });
}

// Helper: run rank 0 and 1 of a 4-rank site with a short timeout; ranks 2 and 3 never come.
TEST(Rendezvous, TimeoutNamesTheMissingRanks) {
  const int port = test::fresh_port();
  std::vector<std::string> messages(2);
  std::vector<std::vector<int>> missing(2);
  std::vector<Clock::duration> took(2);
  test::run_ranks(2, [&](int r) {
    auto t0 = Clock::now();
    try {
      Rendezvous rv(options("paris", r, 4, port, 1s));
      ADD_FAILURE() << "rendezvous completed without ranks 2 and 3";
    } catch (const RendezvousTimeout& e) {
      messages[static_cast<size_t>(r)] = e.what();
      missing[static_cast<size_t>(r)] = e.missing();
      EXPECT_EQ(e.site(), "paris");
    }
    took[static_cast<size_t>(r)] = Clock::now() - t0;
  });
  for (int r = 0; r < 2; ++r) {
    const auto& m = messages[static_cast<size_t>(r)];
    EXPECT_EQ(missing[static_cast<size_t>(r)], (std::vector<int>{2, 3}));
    EXPECT_NE(m.find("site paris: rendezvous timed out after 1 s waiting for ranks 2, 3 at 127.0.0.1:" +
                     std::to_string(port)),
              std::string::npos)
        << m;
    EXPECT_GE(took[static_cast<size_t>(r)], 1s);
    EXPECT_LT(took[static_cast<size_t>(r)], 3s);
  }
}

TEST(Rendezvous, MissingRankZeroIsNamed) {
  const int port = test::fresh_port();
  auto t0 = Clock::now();
  try {
    Rendezvous rv(options("tokyo", 1, 2, port, 500ms));
    FAIL() << "no rank 0, yet the rendezvous completed";
  } catch (const RendezvousTimeout& e) {
    EXPECT_EQ(e.missing(), std::vector<int>{0});
    std::string m = e.what();
    EXPECT_NE(m.find("site tokyo: rendezvous timed out after 0.5 s waiting for rank 0"), std::string::npos) << m;
  }
  EXPECT_LT(Clock::now() - t0, 3s);
}

TEST(Rendezvous, SameRankTwiceIsAnError) {
  const int port = test::fresh_port();
  std::atomic<int> dup_errors{0}, timeouts{0};
  test::run_ranks(3, [&](int t) {
    // Threads 1 and 2 both claim rank 1 of a 2-rank site.
    const int rank = t == 0 ? 0 : 1;
    if (t == 2) std::this_thread::sleep_for(100ms);
    try {
      Rendezvous rv(options("paris", rank, 2, port, 2s));
      // The first claimant completes; rank 0 keeps its server alive until the duplicate is done.
      std::this_thread::sleep_for(600ms);
    } catch (const RendezvousTimeout&) {
      timeouts++;
    } catch (const RendezvousError& e) {
      EXPECT_NE(std::string(e.what()).find("rank 1 joined the rendezvous"), std::string::npos) << e.what();
      dup_errors++;
    }
  });
  EXPECT_EQ(dup_errors.load(), 1);
  EXPECT_EQ(timeouts.load(), 0);
}

TEST(Rendezvous, ValidatesOptions) {
  EXPECT_THROW(Rendezvous(options("paris", 2, 2, 1234)), InputError);
  EXPECT_THROW(Rendezvous(options("paris", 0, 0, 1234)), InputError);
  EXPECT_THROW(Rendezvous(options("paris", 0, 1, 0)), InputError);
  EXPECT_THROW(Rendezvous(options("", 0, 1, 1234)), InputError);
}

}  // namespace
}  // namespace geoloco::parallel

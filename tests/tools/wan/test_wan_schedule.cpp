// Delay-line decisions without netfilter: exact delays, jitter bounds, FIFO order, seeded
// determinism, loss rate (statistical), and release order.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tools/wan/delay_schedule.hpp"
#include "core/error.hpp"

namespace geoloco::wan {
namespace {

TEST(WanSchedule, ConstantDelayIsExact) {
  DelaySchedule s({20'000'000, 0, 0.0, 7, false});
  for (int64_t t = 0; t < 1000; ++t) {
    const Decision d = s.admit(t * 1000);
    ASSERT_FALSE(d.drop);
    ASSERT_EQ(d.due_ns, t * 1000 + 20'000'000);
  }
}

TEST(WanSchedule, JitterStaysInBoundsAndIsCentred) {
  const int64_t delay = 10'000'000, jitter = 2'000'000;
  DelaySchedule s({delay, jitter, 0.0, 11, true});
  double sum = 0;
  const int n = 100000;
  int64_t lo = INT64_MAX, hi = INT64_MIN;
  for (int i = 0; i < n; ++i) {
    const int64_t t = int64_t{i} * 100'000;
    const int64_t off = s.admit(t).due_ns - t - delay;
    lo = std::min(lo, off);
    hi = std::max(hi, off);
    sum += static_cast<double>(off);
  }
  EXPECT_GE(lo, -jitter);
  EXPECT_LE(hi, jitter);
  // Uniform on [-J, J]: the range is nearly covered after 1e5 draws...
  EXPECT_LT(lo, -jitter * 99 / 100);
  EXPECT_GT(hi, jitter * 99 / 100);
  // ...and the mean is 0 with standard error J/sqrt(3n) = 3.65 us; allow 5 standard errors.
  EXPECT_LT(std::abs(sum / n), 5.0 * static_cast<double>(jitter) / std::sqrt(3.0 * n));
}

TEST(WanSchedule, FifoModeNeverReordersReorderModeDoes) {
  DelaySchedule fifo({5'000'000, 4'000'000, 0.0, 3, false});
  DelaySchedule reo({5'000'000, 4'000'000, 0.0, 3, true});
  int64_t last = INT64_MIN;
  int inversions = 0;
  int64_t last_r = INT64_MIN;
  for (int i = 0; i < 10000; ++i) {
    const int64_t t = int64_t{i} * 10'000;  // 10 us apart, far less than the jitter
    const int64_t d = fifo.admit(t).due_ns;
    ASSERT_GE(d, last);
    ASSERT_GE(d, t + 1'000'000);  // never earlier than delay - jitter
    last = d;
    const int64_t r = reo.admit(t).due_ns;
    if (r < last_r) ++inversions;
    last_r = r;
  }
  EXPECT_GT(inversions, 1000);
}

TEST(WanSchedule, SameSeedSameDecisionsOtherSeedDiffers) {
  auto run = [](uint64_t seed) {
    DelaySchedule s({1'000'000, 500'000, 0.05, seed, true});
    std::vector<int64_t> out;
    for (int i = 0; i < 2000; ++i) {
      const Decision d = s.admit(int64_t{i} * 1000);
      out.push_back(d.drop ? -1 : d.due_ns);
    }
    return out;
  };
  EXPECT_EQ(run(42), run(42));
  EXPECT_NE(run(42), run(43));
}

TEST(WanSchedule, LossRateMatchesWithinBinomialTolerance) {
  for (double p : {0.001, 0.01, 0.1}) {
    DelaySchedule s({1000, 0, p, 99, false});
    const int n = 200000;
    int drops = 0;
    for (int i = 0; i < n; ++i) drops += s.admit(i).drop ? 1 : 0;
    // Binomial(n, p): 5 standard deviations.
    const double sd = std::sqrt(n * p * (1 - p));
    EXPECT_NEAR(drops, n * p, 5 * sd) << "p=" << p;
  }
  DelaySchedule none({1000, 0, 0.0, 99, false});
  for (int i = 0; i < 10000; ++i) ASSERT_FALSE(none.admit(i).drop);
}

TEST(WanSchedule, RejectsImpossibleParameters) {
  EXPECT_THROW(DelaySchedule({1000, 2000, 0.0, 1, false}), Error);  // jitter > delay
  EXPECT_THROW(DelaySchedule({1000, 0, 1.0, 1, false}), Error);     // loss must be < 1
  EXPECT_THROW(DelaySchedule({-1, 0, 0.0, 1, false}), Error);
}

TEST(WanReleaseQueue, ReleasesByDueTimeThenId) {
  ReleaseQueue q;
  q.push(5, 300);
  q.push(3, 100);
  q.push(4, 100);
  q.push(1, 200);
  std::vector<ReleaseQueue::Entry> out;
  q.pop_due(99, out);
  EXPECT_TRUE(out.empty());
  q.pop_due(200, out);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].id, 3u);
  EXPECT_EQ(out[1].id, 4u);
  EXPECT_EQ(out[2].id, 1u);
  EXPECT_EQ(q.size(), 1u);
  EXPECT_EQ(q.next_due(), 300);
  out.clear();
  q.pop_all(out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].id, 5u);
  EXPECT_TRUE(q.empty());
}

}  // namespace
}  // namespace geoloco::wan

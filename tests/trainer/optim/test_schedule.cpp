#include <gtest/gtest.h>

#include "trainer/optim/schedule.hpp"

using namespace geoloco::trainer;

TEST(Schedule, WarmupIsLinear) {
  ScheduleConfig c;
  c.kind = "cosine";
  c.warmup_steps = 10;
  EXPECT_DOUBLE_EQ(scheduled_lr(c, 1.0, 0, 100), 0.1);
  EXPECT_DOUBLE_EQ(scheduled_lr(c, 1.0, 4, 100), 0.5);
  EXPECT_DOUBLE_EQ(scheduled_lr(c, 1.0, 9, 100), 1.0);
}

TEST(Schedule, CosineEndpointsAndMidpoint) {
  ScheduleConfig c;
  c.kind = "cosine";
  c.warmup_steps = 10;
  c.min_lr = 0.1;
  EXPECT_DOUBLE_EQ(scheduled_lr(c, 1.0, 10, 110), 1.0);
  EXPECT_NEAR(scheduled_lr(c, 1.0, 60, 110), 0.55, 1e-12);  // halfway: (peak + min) / 2
  EXPECT_NEAR(scheduled_lr(c, 1.0, 110, 110), 0.1, 1e-12);
}

TEST(Schedule, LinearAndConstant) {
  ScheduleConfig c;
  c.kind = "linear";
  c.min_lr = 0.0;
  EXPECT_NEAR(scheduled_lr(c, 2.0, 25, 100), 1.5, 1e-12);
  c.kind = "constant";
  EXPECT_DOUBLE_EQ(scheduled_lr(c, 2.0, 99, 100), 2.0);
}

// A joiner's re-warmup: a linear ramp from its join step, 1 before it, after it and when off.
TEST(Schedule, RewarmRampsFromTheJoinStep) {
  EXPECT_DOUBLE_EQ(rewarm_factor(100, 100, 4), 0.25);
  EXPECT_DOUBLE_EQ(rewarm_factor(101, 100, 4), 0.5);
  EXPECT_DOUBLE_EQ(rewarm_factor(103, 100, 4), 1.0);
  EXPECT_DOUBLE_EQ(rewarm_factor(104, 100, 4), 1.0);
  EXPECT_DOUBLE_EQ(rewarm_factor(99, 100, 4), 1.0);
  EXPECT_DOUBLE_EQ(rewarm_factor(100, 100, 0), 1.0);
  EXPECT_DOUBLE_EQ(rewarm_factor(100, 100, 1), 1.0);
}

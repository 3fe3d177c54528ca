#include <gtest/gtest.h>

#include <cmath>

#include "outer_optimizer/outer_optimizer.hpp"

using namespace geoloco::outer;

// Constant pseudo-gradient g: the Nesterov buffer is g (1 - mu^t) / (1 - mu), the step
// lr * (g + mu * buf_t); after T steps p = p0 - lr * sum_t (g + mu * buf_t).
TEST(OuterOptimizer, NesterovClosedForm) {
  OuterOptimizerConfig c;
  c.kind = "nesterov";
  c.lr = 0.7;
  c.momentum = 0.9;
  OuterOptimizer opt(c, 3);
  std::vector<float> p = {1.0f, -2.0f, 0.5f}, g = {0.1f, -0.25f, 0.0f};
  const int T = 7;
  for (int t = 0; t < T; ++t) opt.step(p, g);
  for (int i = 0; i < 3; ++i) {
    double expect = (i == 0 ? 1.0 : i == 1 ? -2.0 : 0.5);
    for (int t = 1; t <= T; ++t) {
      double buf = g[i] * (1 - std::pow(0.9, t)) / (1 - 0.9);
      expect -= 0.7 * (g[i] + 0.9 * buf);
    }
    EXPECT_NEAR(p[i], expect, 1e-5) << i;
  }
  EXPECT_EQ(opt.steps(), T);
}

TEST(OuterOptimizer, PlainSgdLrOneMovesGlobalToLocal) {
  OuterOptimizerConfig c;
  c.kind = "sgd";
  c.lr = 1.0;
  c.momentum = 0.0;
  OuterOptimizer opt(c, 2);
  std::vector<float> global = {2.0f, 3.0f}, local = {1.5f, 3.25f};
  std::vector<float> delta = {global[0] - local[0], global[1] - local[1]};
  opt.step(global, delta);
  EXPECT_EQ(global, local);  // exact for these values
}

TEST(OuterOptimizer, HeavyBallSgd) {
  OuterOptimizerConfig c;
  c.kind = "sgd";
  c.lr = 0.5;
  c.momentum = 0.5;
  OuterOptimizer opt(c, 1);
  std::vector<float> p = {0.0f}, g = {1.0f};
  opt.step(p, g);  // buf 1 -> p -0.5
  opt.step(p, g);  // buf 1.5 -> p -1.25
  EXPECT_FLOAT_EQ(p[0], -1.25f);
}

// Adam's first step moves every coordinate by lr * sign(g) (bias correction), whatever |g|.
TEST(OuterOptimizer, AdamFirstStepIsSignTimesLr) {
  OuterOptimizerConfig c;
  c.kind = "adam";
  c.lr = 0.01;
  OuterOptimizer opt(c, 3);
  std::vector<float> p = {0, 0, 0}, g = {3.0f, -1e-3f, 0.5f};
  opt.step(p, g);
  EXPECT_NEAR(p[0], -0.01, 1e-6);
  EXPECT_NEAR(p[1], 0.01, 1e-4);
  EXPECT_NEAR(p[2], -0.01, 1e-6);
}

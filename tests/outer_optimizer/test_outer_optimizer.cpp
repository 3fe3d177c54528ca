#include <gtest/gtest.h>

#include <cmath>

#include "outer_optimizer/outer_optimizer.hpp"
#include "core/config_node.hpp"
#include "core/error.hpp"

using namespace geoloco::outer;

// Constant pseudo-gradient g: the Nesterov buffer is g (1 - mu^t) / (1 - mu), the step
// lr * (g + mu * buf_t); after T steps p = p0 - lr * sum_t (g + mu * buf_t).
TEST(OuterOptimizer, NesterovClosedForm) {
  OuterOptimizerConfig c;
  c.kind = OuterOptimizerKind::Nesterov;
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
  c.kind = OuterOptimizerKind::Sgd;
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
  c.kind = OuterOptimizerKind::Sgd;
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
  c.kind = OuterOptimizerKind::Adam;
  c.lr = 0.01;
  OuterOptimizer opt(c, 3);
  std::vector<float> p = {0, 0, 0}, g = {3.0f, -1e-3f, 0.5f};
  opt.step(p, g);
  EXPECT_NEAR(p[0], -0.01, 1e-6);
  EXPECT_NEAR(p[1], 0.01, 1e-4);
  EXPECT_NEAR(p[2], -0.01, 1e-6);
}

// SparseLoCo (outer.optimizer.kind: sparseloco): plain descent on the average, no state; its
// momentum is the compression's decayed error feedback, which the config sets from ef_decay
// and requires, with top-k.
TEST(OuterOptimizer, SparseLoCoIsPlainDescentAndItsConfigSetsTheErrorFeedbackDecay) {
  OuterOptimizerConfig c;
  c.kind = OuterOptimizerKind::SparseLoco;
  c.lr = 1.0;
  c.momentum = 0.0;
  OuterOptimizer opt(c, 2);
  std::vector<float> p = {1.0f, 2.0f}, g = {0.25f, -0.5f};
  opt.step(p, g);
  opt.step(p, g);
  EXPECT_EQ(p, (std::vector<float>{0.5f, 3.0f}));
  EXPECT_TRUE(opt.state_a().empty());
  auto outer_from = [](const std::string& yaml) {
    auto doc = geoloco::config::load_string(yaml, "o.yaml");
    return OuterConfig::from_yaml(doc.node().child("outer"));
  };
  const auto ok = outer_from(
      "outer: {optimizer: {kind: sparseloco, ef_decay: 0.9}, compression: {codec: int2, topk: 0.02, block: 4096}}\n");
  EXPECT_EQ(ok.optimizer.lr, 1.0);
  EXPECT_EQ(ok.optimizer.momentum, 0.0);
  EXPECT_TRUE(ok.compression.error_feedback);
  EXPECT_EQ(ok.compression.error_feedback_decay, 0.9);
  EXPECT_EQ(outer_from("outer: {optimizer: {kind: sparseloco}, compression: {codec: int2, topk: 0.02}}\n")
                .compression.error_feedback_decay,
            0.95);
  auto refused = [&](const std::string& yaml, const std::string& part) {
    try {
      outer_from(yaml);
      ADD_FAILURE() << "accepted: " << yaml;
    } catch (const geoloco::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  refused("outer: {optimizer: {kind: sparseloco}, compression: {codec: int2}}\n", "set outer.compression.topk");
  refused("outer: {optimizer: {kind: sparseloco}, compression: {codec: int2, topk: 0.1, error_feedback: false}}\n",
          "error_feedback: true");
  refused("outer: {optimizer: {kind: sparseloco, momentum: 0.9}, compression: {topk: 0.1}}\n",
          "not used by sparseloco");
  refused("outer: {optimizer: {kind: nesterov, ef_decay: 0.9}}\n", "applies only to kind sparseloco");
  refused("outer: {optimizer: {kind: sparseloco, ef_decay: 0}, compression: {topk: 0.1}}\n", "ef_decay");
  refused("outer: {optimizer: {kind: sparseloco}, compression: {topk: 0.1, error_feedback_decay: 0.5}}\n",
          "set by outer.optimizer.ef_decay");
  refused("outer: {compression: {codec: fp32, error_feedback_decay: 0.5}}\n", "applies only with error_feedback");
}

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "trainer/optim/inner_optimizer.hpp"
#include "trainer/optim/grad_clip.hpp"

using namespace geoloco::trainer;

namespace {
ModelConfig tiny() {
  ModelConfig c;
  c.n_layer = 1;
  c.n_head = 1;
  c.n_embd = 4;
  c.block_size = 3;
  c.vocab_size = 5;
  return c;
}
}  // namespace

// With a constant gradient g, m_hat = g and v_hat = g^2 exactly at every step, so without
// decay p_t = p_0 - t * lr * g / (|g| + eps).
TEST(AdamW, ConstantGradientClosedForm) {
  ParamLayout layout(tiny());
  OptimizerConfig cfg;
  cfg.weight_decay = 0.0;
  cfg.eps = 1e-8;
  InnerOptimizer opt(cfg, layout, 0, layout.total());
  std::vector<float> p(layout.total(), 1.0f), g(layout.total());
  for (size_t i = 0; i < g.size(); ++i) g[i] = (i % 2 ? 0.5f : -2.0f);
  const double lr = 1e-3;
  for (int t = 1; t <= 10; ++t) opt.step(p, g, lr);
  for (size_t i = 0; i < p.size(); ++i) {
    double expect = 1.0 - 10 * lr * g[i] / (std::fabs(g[i]) + 1e-8);
    EXPECT_NEAR(p[i], expect, 2e-6) << i;
  }
  EXPECT_EQ(opt.steps(), 10);
}

// Decoupled decay: with a zero gradient, decayed tensors shrink by (1 - lr*wd)^t; biases and
// LayerNorm parameters do not move.
TEST(AdamW, DecoupledWeightDecayOnlyOnWeights) {
  ParamLayout layout(tiny());
  OptimizerConfig cfg;
  cfg.weight_decay = 0.1;
  InnerOptimizer opt(cfg, layout, 0, layout.total());
  std::vector<float> p(layout.total(), 2.0f), g(layout.total(), 0.0f);
  const double lr = 0.01;
  for (int t = 0; t < 5; ++t) opt.step(p, g, lr);
  const double shrunk = 2.0 * std::pow(1.0 - lr * 0.1, 5);
  for (const auto& v : layout.views()) {
    for (int64_t i = v.offset; i < v.offset + v.numel; ++i) {
      if (v.decay())
        EXPECT_NEAR(p[i], shrunk, 1e-6) << v.name;
      else
        EXPECT_EQ(p[i], 2.0f) << v.name;
    }
  }
}

// A shard optimizer over [b, e) touches nothing outside and matches the full optimizer inside.
TEST(AdamW, ShardMatchesFullOptimizer) {
  ParamLayout layout(tiny());
  OptimizerConfig cfg;
  std::vector<float> g(layout.total());
  for (size_t i = 0; i < g.size(); ++i) g[i] = std::sin(0.37f * i);
  std::vector<float> full(layout.total(), 0.3f), shard(layout.total(), 0.3f);
  InnerOptimizer a(cfg, layout, 0, layout.total());
  const int64_t b = 7, e = layout.total() - 5;
  InnerOptimizer s(cfg, layout, b, e);
  for (int t = 0; t < 3; ++t) {
    a.step(full, g, 1e-2);
    s.step(shard, g, 1e-2);
  }
  for (int64_t i = 0; i < layout.total(); ++i) {
    if (i >= b && i < e)
      EXPECT_EQ(shard[i], full[i]) << i;
    else
      EXPECT_EQ(shard[i], 0.3f) << i;
  }
}

TEST(AdamW, ConfigValidation) {
  auto doc = geoloco::config::load_string("o: {kind: adamw, lr: 1e-3, betas: [0.9, 1.5]}\n", "c.yaml");
  try {
    OptimizerConfig::from_yaml(doc.node().child("o"));
    FAIL() << "expected error";
  } catch (const geoloco::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("o.betas"), std::string::npos) << e.what();
  }
}

TEST(GradClip, NormAndScale) {
  std::vector<float> g = {3.0f, 4.0f};
  double norm = std::sqrt(sum_of_squares(g));
  EXPECT_DOUBLE_EQ(norm, 5.0);
  EXPECT_EQ(clip_to_norm(g, norm, 10.0), 1.0f);
  float s = clip_to_norm(g, norm, 1.0);
  EXPECT_NEAR(s, 0.2f, 1e-6);
  EXPECT_NEAR(g[0], 0.6f, 1e-6);
  EXPECT_NEAR(g[1], 0.8f, 1e-6);
}

TEST(GradClip, SumOfSquaresLargeIsDeterministic) {
  std::vector<float> g(100003);
  for (size_t i = 0; i < g.size(); ++i) g[i] = 1.0f / (1 + i % 17);
  double a = sum_of_squares(g), b = sum_of_squares(g);
  EXPECT_EQ(a, b);
  double ref = 0;
  for (float x : g) ref += double(x) * x;
  EXPECT_NEAR(a, ref, 1e-9 * ref);
}

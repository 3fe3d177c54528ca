// Muon (trainer/optim/muon.hpp, inner_optimizer.hpp): Newton-Schulz against a double-precision
// reference and against what it is for (a diagonal matrix's singular values pulled into a band
// around 1), the whole update against a reference computation, AdamW untouched on the other
// tensors, a range that cuts matrices equal to the whole range, and the config's refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <random>
#include <vector>

#include "core/error.hpp"
#include "trainer/optim/inner_optimizer.hpp"
#include "trainer/optim/muon.hpp"
#include "core/config_node.hpp"

using namespace geoloco;
using namespace geoloco::trainer;

namespace {

ModelConfig small() {
  ModelConfig c;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 8;
  c.block_size = 4;
  c.vocab_size = 11;
  return c;
}

std::vector<float> random_vec(size_t n, uint32_t seed, float scale) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

// The reference: the torch formulation (transpose a tall matrix, A = X X^T, X <- a X + B X),
// in double, with plain loops.
std::vector<double> ns_reference(const std::vector<double>& g, int64_t rows, int64_t cols, int steps) {
  const bool tall = rows > cols;
  const int64_t r = tall ? cols : rows, c = tall ? rows : cols;
  std::vector<double> x(static_cast<size_t>(r * c));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) (tall ? x[j * c + i] : x[i * c + j]) = g[i * cols + j];
  double sq = 0;
  for (double v : x) sq += v * v;
  for (auto& v : x) v /= std::sqrt(sq) + 1e-7;
  const double a = 3.4445, b = -4.7750, cc = 2.0315;
  for (int s = 0; s < steps; ++s) {
    std::vector<double> A(static_cast<size_t>(r * r), 0.0), B(A.size(), 0.0), y(x.size(), 0.0);
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < r; ++j)
        for (int64_t k = 0; k < c; ++k) A[i * r + j] += x[i * c + k] * x[j * c + k];
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < r; ++j) {
        double aa = 0;
        for (int64_t k = 0; k < r; ++k) aa += A[i * r + k] * A[k * r + j];
        B[i * r + j] = b * A[i * r + j] + cc * aa;
      }
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < c; ++j) {
        double bx = 0;
        for (int64_t k = 0; k < r; ++k) bx += B[i * r + k] * x[k * c + j];
        y[i * c + j] = a * x[i * c + j] + bx;
      }
    x = y;
  }
  std::vector<double> out(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) out[i * cols + j] = tall ? x[j * c + i] : x[i * c + j];
  return out;
}

OptimizerConfig parse(const std::string& yaml) {
  const auto doc = config::load_string("o: " + yaml + "\n", "c.yaml");
  return OptimizerConfig::from_yaml(doc.node().child("o"));
}

OptimizerConfig muon_config() {
  OptimizerConfig c;
  c.kind = OptimizerKind::Muon;
  c.lr = 2e-3;
  c.weight_decay = 0.1;
  c.muon.lr = 0.02;
  c.muon.momentum = 0.9;
  c.muon.scale = MuonScale::Spectral;
  return c;
}

}  // namespace

TEST(Muon, NewtonSchulzMatchesADoublePrecisionReference) {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{6, 20}, {20, 6}, {9, 9}, {1, 5}}) {
    const auto g = random_vec(static_cast<size_t>(rows * cols), 7 + static_cast<uint32_t>(rows), 0.3f);
    std::vector<float> x = g;
    std::vector<float> scratch;
    newton_schulz(x, rows, cols, 5, scratch);
    const auto ref = ns_reference(std::vector<double>(g.begin(), g.end()), rows, cols, 5);
    double worst = 0;
    for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::fabs(x[i] - ref[i]));
    EXPECT_LT(worst, 2e-5) << rows << " x " << cols;
    // Not the identity map: the iteration changed the (normalized) matrix.
    double moved = 0, sq = 0;
    for (float v : g) sq += double(v) * v;
    for (size_t i = 0; i < x.size(); ++i) moved = std::max(moved, std::fabs(x[i] - g[i] / std::sqrt(sq)));
    EXPECT_GT(moved, 0.05) << rows << " x " << cols;
  }
}

// A diagonal matrix's singular values are its entries' magnitudes; the orthogonalization keeps
// it diagonal with the signs and pulls every magnitude from [0.05, 2] into about [0.7, 1.2].
TEST(Muon, NewtonSchulzPullsSingularValuesTowardOne) {
  const int64_t n = 12;
  std::vector<float> x(static_cast<size_t>(n * n), 0.0f);
  for (int64_t i = 0; i < n; ++i) x[i * n + i] = (i % 2 ? -1.0f : 1.0f) * (0.05f + 1.95f * float(i) / float(n - 1));
  std::vector<float> scratch;
  newton_schulz(x, n, n, 5, scratch);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) {
      const float v = x[i * n + j];
      if (i != j) {
        EXPECT_EQ(v, 0.0f) << i << "," << j;
        continue;
      }
      EXPECT_EQ(std::signbit(v), i % 2 == 1) << i;
      EXPECT_GT(std::fabs(v), 0.65f) << i;
      EXPECT_LT(std::fabs(v), 1.25f) << i;
    }
}

TEST(Muon, TheMatricesAreTheBlocksLinearWeights) {
  const ParamLayout layout(small());
  const auto mats = muon_matrices(layout);
  ASSERT_EQ(mats.size(), 8u);  // 2 blocks x (c_attn, attn c_proj, c_fc, mlp c_proj)
  const auto& b0 = layout.block(0);
  EXPECT_EQ(mats[0].offset, b0.attn_w);
  EXPECT_EQ(mats[0].rows, 8);
  EXPECT_EQ(mats[0].cols, 24);
  EXPECT_EQ(mats[3].offset, b0.fcproj_w);
  EXPECT_EQ(mats[3].rows, 32);
  EXPECT_EQ(mats[3].cols, 8);
  for (const auto& m : mats) EXPECT_NE(m.offset, layout.wte());
  EXPECT_FLOAT_EQ(muon_scale(8, 32, MuonScale::Spectral), 2.0f);  // out / in = 4
  EXPECT_FLOAT_EQ(muon_scale(32, 8, MuonScale::Spectral), 1.0f);
  EXPECT_FLOAT_EQ(muon_scale(8, 32, MuonScale::Rms), static_cast<float>(0.2 * std::sqrt(32.0)));
}

// Three steps against the formula computed here in double; every other tensor gets exactly
// AdamW's bits.
TEST(Muon, TheStepIsTheReferenceComputation) {
  const ParamLayout layout(small());
  const auto cfg = muon_config();
  OptimizerConfig adam_cfg = cfg;
  adam_cfg.kind = OptimizerKind::AdamW;
  const int64_t n = layout.total();
  InnerOptimizer muon(cfg, layout, 0, n), adam(adam_cfg, layout, 0, n);
  EXPECT_FALSE(muon.needs_gather());
  auto p = random_vec(static_cast<size_t>(n), 3, 0.1f);
  auto pa = p;
  std::vector<double> ref(p.begin(), p.end()), mom(p.size(), 0.0);
  const auto mats = muon_matrices(layout);
  for (int step = 0; step < 3; ++step) {
    const auto g = random_vec(p.size(), 10 + step, 0.02f);
    const double lr = cfg.lr * (1.0 - 0.25 * step);  // a schedule: the matrices' lr follows it
    muon.step(p, g, lr);
    adam.step(pa, g, lr);
    const double mlr = 0.02 * (1.0 - 0.25 * step);
    for (const auto& m : mats) {
      std::vector<double> u(static_cast<size_t>(m.rows * m.cols));
      for (size_t i = 0; i < u.size(); ++i) {
        const size_t at = static_cast<size_t>(m.offset) + i;
        mom[at] = 0.9 * mom[at] + 0.1 * g[at];
        u[i] = 0.1 * g[at] + 0.9 * mom[at];
      }
      const auto o = ns_reference(u, m.rows, m.cols, 5);
      const double scale = std::sqrt(std::max(1.0, double(m.cols) / double(m.rows)));
      for (size_t i = 0; i < u.size(); ++i) {
        const size_t at = static_cast<size_t>(m.offset) + i;
        ref[at] = ref[at] * (1.0 - mlr * 0.1) - mlr * scale * o[i];
      }
    }
  }
  std::vector<bool> in_matrix(p.size(), false);
  for (const auto& m : mats) std::fill(in_matrix.begin() + m.offset, in_matrix.begin() + m.end(), true);
  double worst = 0;
  size_t other_differ = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (in_matrix[i])
      worst = std::max(worst, std::fabs(p[i] - ref[i]));
    else
      other_differ += std::bit_cast<uint32_t>(p[i]) != std::bit_cast<uint32_t>(pa[i]);
  }
  EXPECT_LT(worst, 1e-6);
  EXPECT_EQ(other_differ, 0u);
  // The matrices did move (by about 3 x lr x scale per element at most), unlike AdamW's steps.
  double moved = 0;
  for (size_t i = 0; i < p.size(); ++i)
    if (in_matrix[i]) moved = std::max(moved, std::fabs(double(p[i]) - pa[i]));
  EXPECT_GT(moved, 1e-3);
  // Muon's momentum lives in m, v stays zero on its matrices.
  for (size_t i = 0; i < p.size(); ++i)
    if (in_matrix[i]) ASSERT_EQ(muon.v()[i], 0.0f) << i;
}

// Ranges that cut matrices (a sharded site), completed by a gather, give the whole range's
// bits; without the gather the step refuses.
TEST(Muon, ShardsWithTheGatherEqualTheWholeRange) {
  const ParamLayout layout(small());
  const auto cfg = muon_config();
  const int64_t n = layout.total();
  const int64_t cuts[] = {0, layout.block(0).attn_w + 37, layout.block(1).fc_w + 5, n};
  InnerOptimizer whole(cfg, layout, 0, n);
  std::vector<std::unique_ptr<InnerOptimizer>> shards;
  for (int r = 0; r < 3; ++r) shards.push_back(std::make_unique<InnerOptimizer>(cfg, layout, cuts[r], cuts[r + 1]));
  EXPECT_TRUE(shards[0]->needs_gather());
  auto p = random_vec(static_cast<size_t>(n), 5, 0.1f);
  std::vector<std::vector<float>> ps(3, p);
  for (int step = 0; step < 2; ++step) {
    const auto g = random_vec(p.size(), 20 + step, 0.02f);
    whole.step(p, g, cfg.lr);
    // The site's all-gather, done by hand: each shard steps with a gather that copies in the
    // other ranks' parts of the update buffer, recomputed here from their momentum.
    std::vector<InnerOptimizer> before;
    for (auto& sh : shards) before.push_back(*sh);  // each rank's state as this step starts
    for (int r = 0; r < 3; ++r) {
      auto gather = [&, r](std::span<float> buf) {
        for (int o = 0; o < 3; ++o) {
          if (o == r) continue;
          // Rank o's momentum updates: run its own step first on copies (same inputs, same bits).
          InnerOptimizer copy = before[static_cast<size_t>(o)];
          auto po = ps[static_cast<size_t>(o)];
          std::vector<float> captured;
          copy.step(po, g, cfg.lr, [&](std::span<float> b) { captured.assign(b.begin(), b.end()); });
          std::copy(captured.begin() + cuts[o], captured.begin() + cuts[o + 1], buf.begin() + cuts[o]);
        }
      };
      shards[static_cast<size_t>(r)]->step(ps[static_cast<size_t>(r)], g, cfg.lr, gather);
    }
    for (int r = 0; r < 3; ++r)
      for (int64_t i = cuts[r]; i < cuts[r + 1]; ++i)
        ASSERT_EQ(std::bit_cast<uint32_t>(ps[static_cast<size_t>(r)][static_cast<size_t>(i)]),
                  std::bit_cast<uint32_t>(p[static_cast<size_t>(i)]))
            << "rank " << r << " element " << i << " step " << step;
  }
  auto q = p;
  EXPECT_THROW(shards[1]->step(q, q, cfg.lr), geoloco::Error);
}

TEST(Muon, ConfigParsesAndRefuses) {
  const auto ok =
      parse("{kind: muon, lr: 1.0e-3, muon: {lr: 0.05, momentum: 0.9, nesterov: false, ns_steps: 4, scale: rms}}");
  EXPECT_EQ(ok.kind, OptimizerKind::Muon);
  EXPECT_DOUBLE_EQ(ok.muon.lr, 0.05);
  EXPECT_FALSE(ok.muon.nesterov);
  EXPECT_EQ(ok.muon.ns_steps, 4);
  EXPECT_EQ(ok.muon.scale, MuonScale::Rms);
  EXPECT_DOUBLE_EQ(ok.muon_lr(5e-4), 0.025);             // half the peak: half the matrices' lr
  const auto plain = parse("{kind: muon, lr: 1.0e-3}");  // the defaults: Keller Jordan's
  EXPECT_DOUBLE_EQ(plain.muon.lr, 0.02);
  EXPECT_DOUBLE_EQ(plain.muon.momentum, 0.95);
  EXPECT_TRUE(plain.muon.nesterov);
  EXPECT_EQ(plain.muon.ns_steps, 5);
  EXPECT_EQ(plain.muon.scale, MuonScale::Spectral);
  auto fails = [](const std::string& yaml, const std::string& words) {
    try {
      parse(yaml);
      ADD_FAILURE() << "accepted: " << yaml;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  fails("{kind: adamw, muon: {lr: 0.02}}", "kind: muon");
  fails("{kind: muon, muon: {ns_steps: 0}}", "ns_steps");
  fails("{kind: muon, muon: {lr: 0}}", "muon.lr");
  fails("{kind: muon, muon: {momentum: 1.0}}", "momentum");
  fails("{kind: muon, muon: {scale: huge}}", "scale");
  fails("{kind: muon, muon: {beta: 0.9}}", "beta");
  fails("{kind: lion}", "kind");
}

// The whole model: initialisation, input validation, gradient against finite differences,
// the fast path against the reference path, accumulation and determinism.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/rng.hpp"
#include "trainer/model/gpt.hpp"

namespace geoloco::trainer {
namespace {

ModelConfig tiny() {
  ModelConfig c;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 8;
  c.block_size = 8;
  c.vocab_size = 11;
  return c;
}

std::vector<int32_t> tokens(int n, int V, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(rng.below(static_cast<uint64_t>(V)));
  return t;
}

// Random parameters with LayerNorm weights near 1: larger than GPT-2 init so every path
// carries a signal the finite differences can see.
std::vector<float> random_params(const ParamLayout& layout, uint64_t seed, double sd) {
  std::vector<float> p(static_cast<size_t>(layout.total()));
  Rng rng(seed);
  for (const auto& v : layout.views())
    for (int64_t j = 0; j < v.numel; ++j)
      p[v.offset + j] = float((v.kind == ParamKind::LayerNormWeight ? 1.0 : 0.0) + sd * rng.normal());
  return p;
}

TEST(Gpt, InitStatisticsAndDeterminism) {
  ModelConfig c = tiny();
  c.n_embd = 64;
  c.vocab_size = 256;
  c.n_layer = 3;
  c.block_size = 32;
  const ParamLayout layout(c);
  std::vector<float> a(layout.total()), b(layout.total()), d(layout.total());
  Gpt::init_params(layout, a, 42);
  Gpt::init_params(layout, b, 42);
  Gpt::init_params(layout, d, 43);
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
  EXPECT_NE(a, d);
  for (const auto& v : layout.views()) {
    const float* p = a.data() + v.offset;
    double sum = 0, sq = 0;
    for (int64_t j = 0; j < v.numel; ++j) sum += p[j], sq += double(p[j]) * p[j];
    const double mean = sum / v.numel, sd = std::sqrt(sq / v.numel - mean * mean);
    switch (v.kind) {
      case ParamKind::LayerNormWeight:
        EXPECT_EQ(sum, double(v.numel)) << v.name;
        EXPECT_EQ(sq, double(v.numel)) << v.name;
        break;
      case ParamKind::LayerNormBias:
      case ParamKind::LinearBias: EXPECT_EQ(sq, 0.0) << v.name; break;
      default: {
        const bool residual = v.name.ends_with("c_proj.weight");
        const double want = residual ? 0.02 / std::sqrt(2.0 * c.n_layer) : 0.02;
        // Sample sd of n normals has relative error ~1/sqrt(2n) (n >= 4096 here: < 1.2%);
        // 6% and a 5-sigma mean bound cannot fail by chance for a correct generator.
        EXPECT_NEAR(sd, want, 0.06 * want) << v.name;
        EXPECT_NEAR(mean, 0.0, 5 * want / std::sqrt(double(v.numel))) << v.name;
      }
    }
  }
  std::vector<float> wrong(10);
  EXPECT_THROW(Gpt::init_params(layout, wrong, 1), Error);
}

TEST(Gpt, ZeroWeightsGiveLogVocabLoss) {
  // All weights 0 (LayerNorm weights 1): every hidden state is 0, so the final LayerNorm
  // outputs its bias 0, the logits are all 0, and the loss is exactly log(V).
  const ModelConfig c = tiny();
  for (KernelPath path : {KernelPath::Fast, KernelPath::Reference}) {
    Gpt gpt(c, path);
    std::vector<float> p(gpt.layout().total(), 0.0f);
    for (const auto& v : gpt.layout().views())
      if (v.kind == ParamKind::LayerNormWeight) std::fill(p.begin() + v.offset, p.begin() + v.offset + v.numel, 1.0f);
    const auto in = tokens(2 * 8, c.vocab_size, 1), tg = tokens(2 * 8, c.vocab_size, 2);
    EXPECT_NEAR(gpt.forward(p, in.data(), tg.data(), 2, 8), std::log(11.0), 1e-6);
    for (float pr : gpt.probs()) EXPECT_NEAR(pr, 1.0f / 11, 1e-7);
  }
}

TEST(Gpt, RejectsBadTokensAndShapes) {
  Gpt gpt(tiny());
  std::vector<float> p(gpt.layout().total());
  Gpt::init_params(gpt.layout(), p, 1);
  auto in = tokens(2 * 4, 11, 3), tg = tokens(2 * 4, 11, 4);
  in[6] = 11;  // row 1, t 2
  try {
    gpt.forward(p, in.data(), tg.data(), 2, 4);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("input token id 11 at position 6 (row 1, t 2)"), std::string::npos) << msg;
  }
  in[6] = 0;
  tg[0] = -1;
  try {
    gpt.forward(p, in.data(), tg.data(), 2, 4);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("target token id -1 at position 0"), std::string::npos) << e.what();
  }
  tg[0] = 10;
  EXPECT_THROW(gpt.forward(p, in.data(), tg.data(), 1, 9), InputError);  // T > block_size
  EXPECT_THROW(gpt.forward(p, in.data(), tg.data(), 0, 4), InputError);
  std::vector<float> short_params(5);
  EXPECT_THROW(gpt.forward(short_params, in.data(), tg.data(), 2, 4), Error);
  EXPECT_NO_THROW(gpt.forward(p, in.data(), tg.data(), 2, 4));
}

TEST(Gpt, BackwardNeedsItsForward) {
  Gpt gpt(tiny());
  std::vector<float> p(gpt.layout().total()), g(gpt.layout().total(), 0.0f);
  Gpt::init_params(gpt.layout(), p, 1);
  EXPECT_THROW(gpt.backward(p, g), Error);  // no forward yet
  const auto in = tokens(4, 11, 5), tg = tokens(4, 11, 6);
  gpt.forward(p, in.data(), tg.data(), 1, 4);
  std::vector<float> other = p;
  EXPECT_THROW(gpt.backward(other, g), Error);  // not the params the forward saw
  gpt.backward(p, g);
  EXPECT_THROW(gpt.backward(p, g), Error);  // second backward for one forward
  EXPECT_THROW(gpt.probs(), Error);         // consumed by backward
  gpt.evaluate(p, in.data(), tg.data(), 1, 4);
  EXPECT_THROW(gpt.backward(p, g), Error);  // evaluate keeps nothing for backward
}

TEST(Gpt, GradientMatchesFiniteDifferences) {
  // Every parameter of a tiny model, reference path (double accumulators, float storage).
  // Float forward noise is ~1e-7 on a loss of ~2.4; with step 1e-2 the central difference
  // has rounding error ~1e-5 and truncation ~1e-5; bound: 1e-4 + 1e-2 |fd|.
  const ModelConfig c = tiny();
  Gpt gpt(c, KernelPath::Reference);
  auto p = random_params(gpt.layout(), 7, 0.3);
  const int B = 2, T = 5;
  const auto in = tokens(B * T, c.vocab_size, 8), tg = tokens(B * T, c.vocab_size, 9);
  std::vector<float> g(p.size(), 0.0f);
  gpt.forward(p, in.data(), tg.data(), B, T);
  gpt.backward(p, g);
  const float h = 1e-2f;
  double worst = 0;
  int checked = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (i >= size_t(gpt.layout().wpe() + T * c.n_embd) && i < size_t(gpt.layout().block(0).begin)) {
      EXPECT_EQ(g[i], 0.0f) << "wpe rows past T get no gradient";
      continue;
    }
    const float saved = p[i];
    p[i] = saved + h;
    const double lp = gpt.evaluate(p, in.data(), tg.data(), B, T);
    p[i] = saved - h;
    const double lm = gpt.evaluate(p, in.data(), tg.data(), B, T);
    p[i] = saved;
    const double fd = (lp - lm) / (2.0 * h);
    EXPECT_NEAR(g[i], fd, 1e-4 + 1e-2 * std::abs(fd)) << "param " << i;
    worst = std::max(worst, std::abs(g[i] - fd));
    ++checked;
  }
  RecordProperty("max_abs_err", std::to_string(worst));
  EXPECT_GT(checked, 1000);
}

float max_abs(const std::vector<float>& v) {
  float m = 0;
  for (float x : v) m = std::max(m, std::abs(x));
  return m;
}

TEST(Gpt, FastMatchesReference) {
  // Tolerance: loss within 2e-6 relative; every gradient within 1e-4 of the largest
  // gradient's magnitude (float GEMM order vs double accumulators across ~10 chained ops).
  ModelConfig c;
  c.n_layer = 2, c.n_head = 4, c.n_embd = 32, c.block_size = 80, c.vocab_size = 50;
  const int B = 2, T = 70;  // T > 64: the fast attention's second row block
  const auto in = tokens(B * T, c.vocab_size, 10), tg = tokens(B * T, c.vocab_size, 11);
  Gpt fast(c, KernelPath::Fast), ref(c, KernelPath::Reference);
  std::vector<float> p(fast.layout().total());
  Gpt::init_params(fast.layout(), p, 12);
  for (int step = 0; step < 2; ++step) {  // twice: the second reuses every buffer
    std::vector<float> gf(p.size(), 0.0f), gr(p.size(), 0.0f);
    const float lf = fast.forward(p, in.data(), tg.data(), B, T);
    const float lr = ref.forward(p, in.data(), tg.data(), B, T);
    EXPECT_NEAR(lf, lr, 2e-6 * lr);
    fast.backward(p, gf);
    ref.backward(p, gr);
    const float scale = max_abs(gr);
    ASSERT_GT(scale, 0.0f);
    for (const auto& v : fast.layout().views()) {
      float worst = 0;
      for (int64_t j = 0; j < v.numel; ++j) worst = std::max(worst, std::abs(gf[v.offset + j] - gr[v.offset + j]));
      EXPECT_LE(worst, 1e-4f * scale) << v.name;
    }
  }
}

TEST(Gpt, BackwardAccumulatesWithLossScale) {
  const ModelConfig c = tiny();
  Gpt gpt(c);
  std::vector<float> p(gpt.layout().total());
  Gpt::init_params(gpt.layout(), p, 3);
  const auto in1 = tokens(16, 11, 20), tg1 = tokens(16, 11, 21), in2 = tokens(16, 11, 22), tg2 = tokens(16, 11, 23);
  std::vector<float> g1(p.size(), 0.0f), g2(p.size(), 0.0f), acc(p.size(), 0.0f);
  gpt.forward(p, in1.data(), tg1.data(), 2, 8);
  gpt.backward(p, g1);
  gpt.forward(p, in2.data(), tg2.data(), 2, 8);
  gpt.backward(p, g2);
  gpt.forward(p, in1.data(), tg1.data(), 2, 8);
  gpt.backward(p, acc, 0.5f);
  gpt.forward(p, in2.data(), tg2.data(), 2, 8);
  gpt.backward(p, acc, 0.5f);
  const float scale = std::max(max_abs(g1), max_abs(g2));
  for (size_t i = 0; i < p.size(); ++i) EXPECT_NEAR(acc[i], 0.5f * (g1[i] + g2[i]), 1e-6f * scale) << i;
}

TEST(Gpt, RunsAreBitIdenticalAndBuffersReusable) {
  ModelConfig c;
  c.n_layer = 2, c.n_head = 2, c.n_embd = 16, c.block_size = 16, c.vocab_size = 30;
  Gpt::set_num_threads(2);
  Gpt a(c), b(c);
  std::vector<float> p(a.layout().total());
  Gpt::init_params(a.layout(), p, 5);
  const auto big_in = tokens(4 * 16, 30, 30), big_tg = tokens(4 * 16, 30, 31);
  const auto in = tokens(2 * 9, 30, 32), tg = tokens(2 * 9, 30, 33);
  // a first runs a larger batch (buffers grow), b starts fresh with the small one.
  std::vector<float> ga(p.size(), 0.0f), gb(p.size(), 0.0f), scratch(p.size(), 0.0f);
  a.forward(p, big_in.data(), big_tg.data(), 4, 16);
  a.backward(p, scratch);
  const float la = a.forward(p, in.data(), tg.data(), 2, 9);
  a.backward(p, ga);
  const float lb = b.forward(p, in.data(), tg.data(), 2, 9);
  b.backward(p, gb);
  Gpt::set_num_threads(1);
  EXPECT_EQ(0, std::memcmp(&la, &lb, sizeof(float)));
  EXPECT_EQ(0, std::memcmp(ga.data(), gb.data(), ga.size() * sizeof(float)));
  EXPECT_EQ(a.losses().size(), 18u);
}

}  // namespace
}  // namespace geoloco::trainer

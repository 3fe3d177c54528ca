// Every reference kernel's backward against central finite differences of its forward,
// in double precision (the reference kernels are templates). Each check uses the scalar
// L = sum(out * R) for a fixed random R, so dL/dout = R; gradients start from random
// values to check that backward accumulates (+=) rather than overwrites.
// Tolerance: |analytic - fd| <= 1e-7 + 1e-6 |fd| (double, step 1e-5: truncation ~1e-10,
// rounding ~1e-11 -- the bound is loose only to stay robust, any real bug is >> 1e-4).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <vector>

#include "core/rng.hpp"
#include "trainer/model/kernels_ref.hpp"

namespace geoloco::trainer {
namespace {

using Vec = std::vector<double>;

Vec random_vec(size_t n, uint64_t seed, double scale = 1.0) {
  Rng rng(seed);
  Vec v(n);
  for (auto& x : v) x = scale * rng.normal();
  return v;
}

double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Checks grad - pre (what backward added) against finite differences of loss() in x.
void expect_grad(const char* what, Vec& x, const Vec& grad, const Vec& pre, const std::function<double()>& loss) {
  constexpr double h = 1e-5;
  ASSERT_EQ(x.size(), grad.size());
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + h;
    const double lp = loss();
    x[i] = saved - h;
    const double lm = loss();
    x[i] = saved;
    const double fd = (lp - lm) / (2 * h);
    const double got = grad[i] - pre[i];
    EXPECT_NEAR(got, fd, 1e-7 + 1e-6 * std::abs(fd)) << what << "[" << i << "]";
    worst = std::max(worst, std::abs(got - fd));
  }
  ::testing::Test::RecordProperty(what, std::to_string(worst));
}

TEST(KernelGrad, Encoder) {
  const int B = 2, T = 3, C = 4, V = 5;
  const std::vector<int32_t> inp = {1, 4, 1, 0, 1, 3};  // token 1 repeats: its wte row accumulates
  Vec wte = random_vec(V * C, 1), wpe = random_vec(T * C, 2), R = random_vec(B * T * C, 3), out(B * T * C);
  auto loss = [&] {
    ref::encoder_forward(out.data(), inp.data(), wte.data(), wpe.data(), B, T, C);
    return dot(out, R);
  };
  const Vec pre_wte = random_vec(V * C, 4), pre_wpe = random_vec(T * C, 5);
  Vec dwte = pre_wte, dwpe = pre_wpe;
  ref::encoder_backward(dwte.data(), dwpe.data(), R.data(), inp.data(), B, T, C);
  expect_grad("dwte", wte, dwte, pre_wte, loss);
  expect_grad("dwpe", wpe, dwpe, pre_wpe, loss);
  // Linear map: the gradient is exactly the sum of R rows that used each token.
  for (int c = 0; c < C; ++c)
    EXPECT_DOUBLE_EQ(dwte[1 * C + c] - pre_wte[1 * C + c], R[0 * C + c] + R[2 * C + c] + R[4 * C + c]);
}

TEST(KernelGrad, LayerNorm) {
  const int N = 3, C = 7;
  Vec x = random_vec(N * C, 10, 2.0), w = random_vec(C, 11), b = random_vec(C, 12), R = random_vec(N * C, 13);
  Vec out(N * C), mean(N), rstd(N);
  auto loss = [&] {
    ref::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
    return dot(out, R);
  };
  loss();
  const Vec pre_x = random_vec(N * C, 14), pre_w = random_vec(C, 15), pre_b = random_vec(C, 16);
  Vec dx = pre_x, dw = pre_w, db = pre_b;
  ref::layernorm_backward(dx.data(), dw.data(), db.data(), R.data(), x.data(), w.data(), mean.data(), rstd.data(), N,
                          C);
  expect_grad("dx", x, dx, pre_x, loss);
  expect_grad("dw", w, dw, pre_w, loss);
  expect_grad("db", b, db, pre_b, loss);
}

TEST(KernelGrad, LayerNormForwardNormalizes) {
  // Exact property: with w = 1, b = 0 each row has mean 0 and variance v / (v + eps).
  const int N = 2, C = 4;
  Vec x = {1, 2, 3, 4, -1, -1, 1, 1}, w(C, 1.0), b(C, 0.0), out(N * C), mean(N), rstd(N);
  ref::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  EXPECT_DOUBLE_EQ(mean[0], 2.5);
  EXPECT_DOUBLE_EQ(mean[1], 0.0);
  EXPECT_NEAR(rstd[0], 1.0 / std::sqrt(1.25 + 1e-5), 1e-15);
  EXPECT_NEAR(out[0], -1.5 / std::sqrt(1.25 + 1e-5), 1e-15);
  EXPECT_NEAR(out[4], -1.0 / std::sqrt(1.0 + 1e-5), 1e-15);
}

TEST(KernelGrad, Matmul) {
  const int N = 4, IC = 5, OC = 3;
  Vec x = random_vec(N * IC, 20), w = random_vec(IC * OC, 21), bias = random_vec(OC, 22), R = random_vec(N * OC, 23);
  Vec out(N * OC);
  auto loss = [&] {
    ref::matmul_forward(out.data(), x.data(), w.data(), bias.data(), N, IC, OC);
    return dot(out, R);
  };
  const Vec pre_x = random_vec(N * IC, 24), pre_w = random_vec(IC * OC, 25), pre_b = random_vec(OC, 26);
  Vec dx = pre_x, dw = pre_w, db = pre_b;
  ref::matmul_backward(dx.data(), dw.data(), db.data(), R.data(), x.data(), w.data(), N, IC, OC);
  expect_grad("dx", x, dx, pre_x, loss);
  expect_grad("dw", w, dw, pre_w, loss);
  expect_grad("dbias", bias, db, pre_b, loss);
  // HF Conv1D layout [in, out]: out[0,0] = sum_i x[0,i] w[i,0] + b[0].
  double want = bias[0];
  for (int i = 0; i < IC; ++i) want += x[i] * w[i * OC];
  loss();
  EXPECT_NEAR(out[0], want, 1e-14);
}

TEST(KernelGrad, Attention) {
  const int B = 2, T = 5, C = 6, NH = 2;
  Vec qkv = random_vec(B * T * 3 * C, 30), R = random_vec(B * T * C, 31), out(B * T * C), att(B * NH * T * T);
  auto loss = [&] {
    ref::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
    return dot(out, R);
  };
  loss();
  const Vec pre = random_vec(qkv.size(), 32);
  Vec dqkv = pre;
  ref::attention_backward(dqkv.data(), R.data(), qkv.data(), att.data(), B, T, C, NH);
  expect_grad("dqkv", qkv, dqkv, pre, loss);
}

TEST(KernelGrad, AttentionIsCausal) {
  const int B = 1, T = 4, C = 4, NH = 2;
  Vec qkv = random_vec(B * T * 3 * C, 33), out(B * T * C), att(B * NH * T * T);
  ref::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
  for (int h = 0; h < NH; ++h)
    for (int t = 0; t < T; ++t) {
      double sum = 0;
      for (int s = 0; s < T; ++s) {
        const double p = att[(h * T + t) * T + s];
        if (s > t) {
          EXPECT_EQ(p, 0.0);
        }
        sum += p;
      }
      EXPECT_NEAR(sum, 1.0, 1e-15);
    }
  // The first query sees only itself: its output is exactly its own value vector.
  for (int i = 0; i < C; ++i) EXPECT_DOUBLE_EQ(out[i], qkv[2 * C + i]);
  // Changing the last token's k and v must not change any earlier output.
  Vec out2(out.size());
  for (int i = C; i < 3 * C; ++i) qkv[(T - 1) * 3 * C + i] += 1.0;
  ref::attention_forward(out2.data(), att.data(), qkv.data(), B, T, C, NH);
  for (int i = 0; i < (T - 1) * C; ++i) EXPECT_EQ(out2[i], out[i]);
}

TEST(KernelGrad, Gelu) {
  const int n = 40;
  Vec x = random_vec(n, 40, 3.0), R = random_vec(n, 41), out(n);
  auto loss = [&] {
    ref::gelu_forward(out.data(), x.data(), n);
    return dot(out, R);
  };
  const Vec pre = random_vec(n, 42);
  Vec dx = pre;
  ref::gelu_backward(dx.data(), x.data(), R.data(), n);
  expect_grad("dx", x, dx, pre, loss);
  Vec known = {0.0, 1.0}, y(2);
  ref::gelu_forward(y.data(), known.data(), 2);
  EXPECT_EQ(y[0], 0.0);
  EXPECT_NEAR(y[1], 0.5 * (1 + std::tanh(std::sqrt(2 / M_PI) * 1.044715)), 1e-15);
}

TEST(KernelGrad, Residual) {
  const int n = 9;
  Vec a = random_vec(n, 50), b = random_vec(n, 51), R = random_vec(n, 52), out(n);
  auto loss = [&] {
    ref::residual_forward(out.data(), a.data(), b.data(), n);
    return dot(out, R);
  };
  const Vec pre_a = random_vec(n, 53), pre_b = random_vec(n, 54);
  Vec da = pre_a, db = pre_b;
  ref::residual_backward(da.data(), db.data(), R.data(), n);
  expect_grad("da", a, da, pre_a, loss);
  expect_grad("db", b, db, pre_b, loss);
}

TEST(KernelGrad, LmHead) {
  const int N = 3, C = 4, V = 6;
  Vec x = random_vec(N * C, 60), wte = random_vec(V * C, 61), R = random_vec(N * V, 62), out(N * V);
  auto loss = [&] {
    ref::lm_head_forward(out.data(), x.data(), wte.data(), N, C, V);
    return dot(out, R);
  };
  const Vec pre_x = random_vec(N * C, 63), pre_w = random_vec(V * C, 64);
  Vec dx = pre_x, dw = pre_w;
  ref::lm_head_backward(dx.data(), dw.data(), R.data(), x.data(), wte.data(), N, C, V);
  expect_grad("dx", x, dx, pre_x, loss);
  expect_grad("dwte", wte, dw, pre_w, loss);
}

TEST(KernelGrad, CrossEntropy) {
  const int N = 4, V = 7;
  const std::vector<int32_t> targets = {0, 6, 3, 3};
  Vec logits = random_vec(N * V, 70, 2.0), probs(N * V), losses(N);
  auto loss = [&] {
    return ref::crossentropy_forward(probs.data(), losses.data(), logits.data(), targets.data(), N, V);
  };
  loss();
  Vec dlogits(N * V, 123.0);  // garbage: crossentropy_backward writes, never accumulates
  ref::crossentropy_backward(dlogits.data(), probs.data(), targets.data(), 1.0 / N, N, V);
  expect_grad("dlogits", logits, dlogits, Vec(N * V, 0.0), loss);
  // Uniform logits: loss is exactly log V.
  Vec flat(N * V, 0.25);
  EXPECT_NEAR(ref::crossentropy_forward(probs.data(), losses.data(), flat.data(), targets.data(), N, V), std::log(7.0),
              1e-15);
}

TEST(KernelGrad, CrossEntropyExtremeLogits) {
  // The target's probability underflows to 0 in double, yet the loss stays finite and exact.
  const std::vector<int32_t> targets = {1};
  Vec logits = {0.0, -2000.0}, probs(2), losses(1);
  EXPECT_DOUBLE_EQ(ref::crossentropy_forward(probs.data(), losses.data(), logits.data(), targets.data(), 1, 2), 2000.0);
}

}  // namespace
}  // namespace geoloco::trainer

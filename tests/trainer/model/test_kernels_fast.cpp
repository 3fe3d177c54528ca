// Fast kernels against the reference kernels (both float), forward and backward, on
// shapes that exercise the awkward paths: attention with T > 64 and a partial last
// row block, odd widths, repeated tokens. Tolerance: max |fast - ref| <= 2e-5 * max(1,
// max |ref|) -- float GEMMs sum in a different order than the reference's double
// accumulators (error ~ sqrt(K) * 6e-8 * magnitude for K <= 256), and exp_fast is within
// a few ulp of exp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/rng.hpp"
#include "trainer/model/fast_math.hpp"
#include "trainer/model/kernels_fast.hpp"
#include "trainer/model/kernels_ref.hpp"

namespace geoloco::trainer {
namespace {

using Vec = std::vector<float>;

Vec random_vec(size_t n, uint64_t seed, double scale = 1.0) {
  Rng rng(seed);
  Vec v(n);
  for (auto& x : v) x = float(scale * rng.normal());
  return v;
}

void expect_close(const char* what, const Vec& fast, const Vec& ref, double rel = 2e-5) {
  ASSERT_EQ(fast.size(), ref.size());
  double mag = 1.0, worst = 0;
  for (float r : ref) mag = std::max(mag, double(std::abs(r)));
  for (size_t i = 0; i < ref.size(); ++i) worst = std::max(worst, double(std::abs(fast[i] - ref[i])));
  EXPECT_LE(worst, rel * mag) << what << ": max abs diff " << worst << " at magnitude " << mag;
}

TEST(FastMath, ExpAndTanhAccuracy) {
  double worst_exp = 0, worst_tanh = 0;
  for (int i = -86900; i <= 87900; ++i) {  // inside the clamp range [-87, 88]
    const float x = float(i) * 1e-3f;
    const double e = std::exp(double(x));
    worst_exp = std::max(worst_exp, std::abs(fastmath::exp_fast(x) - e) / e);
    if (std::abs(x) < 20.0f)
      worst_tanh = std::max(worst_tanh, std::abs(double(fastmath::tanh_fast(x)) - std::tanh(double(x))));
  }
  EXPECT_LE(worst_exp, 3e-7);  // ~2.5 float ulp
  EXPECT_LE(worst_tanh, 3e-7);
  EXPECT_EQ(fastmath::exp_fast(0.0f), 1.0f);
  EXPECT_EQ(fastmath::tanh_fast(30.0f), 1.0f);
  EXPECT_EQ(fastmath::tanh_fast(-30.0f), -1.0f);
  EXPECT_GE(fastmath::exp_fast(-1000.0f), 0.0f);
  EXPECT_LT(fastmath::exp_fast(-1000.0f), 1e-37f);
}

TEST(FastKernels, EncoderMatchesReference) {
  const int B = 3, T = 5, C = 12, V = 7;
  std::vector<int32_t> inp(B * T);
  for (int i = 0; i < B * T; ++i) inp[i] = (i * 5) % V;
  Vec wte = random_vec(V * C, 1), wpe = random_vec(T * C, 2), dout = random_vec(B * T * C, 3);
  Vec of(B * T * C), orf(B * T * C);
  fast::encoder_forward(of.data(), inp.data(), wte.data(), wpe.data(), B, T, C);
  ref::encoder_forward(orf.data(), inp.data(), wte.data(), wpe.data(), B, T, C);
  EXPECT_EQ(of, orf);  // one add per element: exact
  Vec dwf = random_vec(V * C, 4), dwr = dwf, dpf = random_vec(T * C, 5), dpr = dpf;
  fast::encoder_backward(dwf.data(), dpf.data(), dout.data(), inp.data(), B, T, C);
  ref::encoder_backward(dwr.data(), dpr.data(), dout.data(), inp.data(), B, T, C);
  EXPECT_EQ(dwf, dwr);  // same row order of float adds
  EXPECT_EQ(dpf, dpr);
}

TEST(FastKernels, LayerNormMatchesReference) {
  const int N = 37, C = 48;
  Vec x = random_vec(N * C, 10, 3.0), w = random_vec(C, 11), b = random_vec(C, 12), dout = random_vec(N * C, 13);
  Vec of(N * C), orf(N * C), mf(N), mr(N), rf(N), rr(N);
  fast::layernorm_forward(of.data(), mf.data(), rf.data(), x.data(), w.data(), b.data(), N, C);
  ref::layernorm_forward(orf.data(), mr.data(), rr.data(), x.data(), w.data(), b.data(), N, C);
  expect_close("out", of, orf);
  expect_close("rstd", rf, rr);
  Vec dxf = random_vec(N * C, 14), dxr = dxf, dwf(C, 0.5f), dwr = dwf, dbf(C, -1.0f), dbr = dbf;
  fast::layernorm_backward(dxf.data(), dwf.data(), dbf.data(), dout.data(), x.data(), w.data(), mr.data(), rr.data(), N,
                           C);
  ref::layernorm_backward(dxr.data(), dwr.data(), dbr.data(), dout.data(), x.data(), w.data(), mr.data(), rr.data(), N,
                          C);
  expect_close("dx", dxf, dxr);
  expect_close("dw", dwf, dwr);
  expect_close("db", dbf, dbr);
}

TEST(FastKernels, MatmulMatchesReference) {
  const int N = 33, IC = 40, OC = 72;
  Vec x = random_vec(N * IC, 20), w = random_vec(IC * OC, 21), bias = random_vec(OC, 22), dout = random_vec(N * OC, 23);
  Vec of(N * OC), orf(N * OC);
  fast::matmul_forward(of.data(), x.data(), w.data(), bias.data(), N, IC, OC);
  ref::matmul_forward(orf.data(), x.data(), w.data(), bias.data(), N, IC, OC);
  expect_close("out", of, orf);
  fast::matmul_forward(of.data(), x.data(), w.data(), nullptr, N, IC, OC);
  ref::matmul_forward<float>(orf.data(), x.data(), w.data(), nullptr, N, IC, OC);
  expect_close("out (no bias)", of, orf);
  Vec dxf = random_vec(N * IC, 24), dxr = dxf, dwf = random_vec(IC * OC, 25), dwr = dwf, dbf = random_vec(OC, 26),
      dbr = dbf;
  fast::matmul_backward(dxf.data(), dwf.data(), dbf.data(), dout.data(), x.data(), w.data(), N, IC, OC);
  ref::matmul_backward(dxr.data(), dwr.data(), dbr.data(), dout.data(), x.data(), w.data(), N, IC, OC);
  expect_close("dx", dxf, dxr);
  expect_close("dw", dwf, dwr);
  expect_close("dbias", dbf, dbr);
}

TEST(FastKernels, AttentionMatchesReference) {
  // T = 150: three row blocks of 64, 64 and 22 queries. Two threads: (b, h) slices run
  // concurrently with OpenBLAS held to one thread.
  for (int threads : {1, 2})
    for (int T : {1, 7, 64, 150}) {
      fast::set_num_threads(threads);
      const int B = 2, C = 32, NH = 2;
      Vec qkv = random_vec(size_t(B) * T * 3 * C, 30 + T), dout = random_vec(size_t(B) * T * C, 31);
      Vec of(size_t(B) * T * C), orf(of.size()), af(size_t(B) * NH * T * T, 7.0f), ar(af.size());
      fast::attention_forward(of.data(), af.data(), qkv.data(), B, T, C, NH);
      ref::attention_forward(orf.data(), ar.data(), qkv.data(), B, T, C, NH);
      fast::set_num_threads(1);
      SCOPED_TRACE("T=" + std::to_string(T) + " threads=" + std::to_string(threads));
      expect_close("out", of, orf);
      expect_close("att", af, ar);  // including the zeros above the diagonal
      Vec dqf = random_vec(qkv.size(), 32), dqr = dqf;
      fast::set_num_threads(threads);
      fast::attention_backward(dqf.data(), dout.data(), qkv.data(), ar.data(), B, T, C, NH);
      fast::set_num_threads(1);
      ref::attention_backward(dqr.data(), dout.data(), qkv.data(), ar.data(), B, T, C, NH);
      expect_close("dqkv", dqf, dqr);
    }
}

TEST(FastKernels, GeluResidualMatchReference) {
  const int n = 1001;
  Vec x = random_vec(n, 40, 4.0), y = random_vec(n, 41), dout = random_vec(n, 42);
  Vec of(n), orf(n);
  fast::gelu_forward(of.data(), x.data(), n);
  ref::gelu_forward(orf.data(), x.data(), n);
  expect_close("gelu", of, orf, 1e-6);
  Vec dxf = random_vec(n, 43), dxr = dxf;
  fast::gelu_backward(dxf.data(), x.data(), dout.data(), n);
  ref::gelu_backward(dxr.data(), x.data(), dout.data(), n);
  expect_close("dgelu", dxf, dxr, 1e-6);
  fast::residual_forward(of.data(), x.data(), y.data(), n);
  ref::residual_forward(orf.data(), x.data(), y.data(), n);
  EXPECT_EQ(of, orf);
  Vec daf = random_vec(n, 44), dar = daf, dbf = random_vec(n, 45), dbr = dbf;
  fast::residual_backward(daf.data(), dbf.data(), dout.data(), n);
  ref::residual_backward(dar.data(), dbr.data(), dout.data(), n);
  EXPECT_EQ(daf, dar);
  EXPECT_EQ(dbf, dbr);
}

TEST(FastKernels, LmHeadAndCrossEntropyMatchReference) {
  const int N = 19, C = 24, V = 131;
  Vec x = random_vec(N * C, 50), wte = random_vec(V * C, 51);
  std::vector<int32_t> targets(N);
  for (int i = 0; i < N; ++i) targets[i] = (i * 37) % V;
  Vec lf(N * V), lr(N * V);
  fast::lm_head_forward(lf.data(), x.data(), wte.data(), N, C, V);
  ref::lm_head_forward(lr.data(), x.data(), wte.data(), N, C, V);
  expect_close("logits", lf, lr);
  Vec pf(N * V), pr(N * V), lossf(N), lossr(N);
  const float mf = fast::crossentropy_forward(pf.data(), lossf.data(), lr.data(), targets.data(), N, V);
  const float mr = ref::crossentropy_forward(pr.data(), lossr.data(), lr.data(), targets.data(), N, V);
  EXPECT_NEAR(mf, mr, 2e-5 * std::abs(mr));
  expect_close("probs", pf, pr);
  expect_close("losses", lossf, lossr);
  Vec df(N * V), dr(N * V);
  fast::crossentropy_backward(df.data(), pr.data(), targets.data(), 0.25f, N, V);
  ref::crossentropy_backward(dr.data(), pr.data(), targets.data(), 0.25f, N, V);
  expect_close("dlogits", df, dr);
  Vec dxf = random_vec(N * C, 52), dxr = dxf, dwf = random_vec(V * C, 53), dwr = dwf;
  fast::lm_head_backward(dxf.data(), dwf.data(), dr.data(), x.data(), wte.data(), N, C, V);
  ref::lm_head_backward(dxr.data(), dwr.data(), dr.data(), x.data(), wte.data(), N, C, V);
  expect_close("dx", dxf, dxr);
  expect_close("dwte", dwf, dwr);
  // In place (probs aliasing logits), as the model uses it.
  Vec inplace = lr;
  fast::crossentropy_forward(inplace.data(), lossf.data(), inplace.data(), targets.data(), N, V);
  EXPECT_EQ(inplace, pf);
}

TEST(FastKernels, ThreadedRunsAreBitIdentical) {
  fast::set_num_threads(2);
  const int N = 64, C = 40, B = 2, T = 70, NH = 4, C2 = 32;
  Vec x = random_vec(N * C, 60, 2.0), w = random_vec(C, 61), dout = random_vec(N * C, 62);
  Vec qkv = random_vec(size_t(B) * T * 3 * C2, 63), dy = random_vec(size_t(B) * T * C2, 64);
  auto run = [&] {
    Vec out(N * C), mean(N), rstd(N), dx(N * C, 0.0f), dw(C, 0.0f), db(C, 0.0f);
    fast::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), w.data(), N, C);
    fast::layernorm_backward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), mean.data(), rstd.data(),
                             N, C);
    Vec y(size_t(B) * T * C2), att(size_t(B) * NH * T * T), dq(qkv.size(), 0.0f);
    fast::attention_forward(y.data(), att.data(), qkv.data(), B, T, C2, NH);
    fast::attention_backward(dq.data(), dy.data(), qkv.data(), att.data(), B, T, C2, NH);
    Vec all = out;
    for (const Vec* v : {&dx, &dw, &db, &y, &dq}) all.insert(all.end(), v->begin(), v->end());
    return all;
  };
  const Vec a = run(), b = run();
  fast::set_num_threads(1);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
}

}  // namespace
}  // namespace geoloco::trainer

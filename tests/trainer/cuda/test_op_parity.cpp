// Op parity: every CUDA op against the CPU reference kernels (trainer/model/kernels_ref.hpp,
// run in double) on the same inputs, in fp32 and bf16, compared by relative L2 error with the
// per-op tolerances of trainer/cuda/tolerance.cpp. In bf16 the inputs are rounded to bf16
// first, so both sides see identical values and only the op's own error is measured.
// Every result is also logged to parity.json (GEOLOCO_GPU_REPORT_DIR) for tools/gpu_check.sh.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>

#include "gpu_test_util.hpp"
#include "trainer/cuda/token_buckets.hpp"
#include "trainer/model/kernels_ref.hpp"

namespace geoloco::cuda::testing {

namespace {
struct ParityRecord {
  std::string op, precision, tensor;
  ErrorStats stats;
  double tol;
  bool ok;
};
std::vector<ParityRecord>& records() {
  static std::vector<ParityRecord> r;
  return r;
}

class ParityReport : public ::testing::Environment {
 public:
  void TearDown() override {
    const char* dir = std::getenv("GEOLOCO_GPU_REPORT_DIR");
    if (!dir || !*dir) return;
    nlohmann::json j;
    j["magic"] = "geoloco-gpu-parity";
    j["version"] = 1;
    bool ok = !records().empty();
    nlohmann::json ops = nlohmann::json::array();
    for (const auto& r : records()) {
      ok = ok && r.ok;
      ops.push_back({{"op", r.op},
                     {"precision", r.precision},
                     {"tensor", r.tensor},
                     {"rel_l2", r.stats.finite ? r.stats.rel_l2 : -1.0},
                     {"max_abs", r.stats.finite ? r.stats.max_abs : -1.0},
                     {"count", r.stats.count},
                     {"tolerance", r.tol},
                     {"ok", r.ok}});
    }
    const auto* ut = ::testing::UnitTest::GetInstance();
    j["ok"] = ok && ut->failed_test_count() == 0;
    j["tests_failed"] = ut->failed_test_count();
    j["tests_passed"] = ut->successful_test_count();
    j["tests_skipped"] = ut->skipped_test_count();
    if (records().empty()) j["note"] = "no comparisons ran: " + no_device_reason();
    j["ops"] = std::move(ops);
    std::ofstream(std::string(dir) + "/parity.json") << j.dump(1) << "\n";
  }
};
[[maybe_unused]] auto* const kParityEnv = ::testing::AddGlobalTestEnvironment(new ParityReport);
}  // namespace

bool record_parity(const std::string& op, Precision p, const std::string& tensor, const ErrorStats& s) {
  const double tol = tolerance(op, p);
  const bool ok = within(s, tol);
  records().push_back({op, precision_name(p), tensor, s, tol, ok});
  return ok;
}

namespace {

using std::vector;

vector<double> dv(const vector<float>& v) { return {v.begin(), v.end()}; }
vector<float> fv(const vector<double>& v) { return {v.begin(), v.end()}; }

#define EXPECT_PARITY(op, p, tensor, got, want)                                                                     \
  do {                                                                                                              \
    const ErrorStats s_ = compare(got, want);                                                                       \
    EXPECT_TRUE(record_parity(op, p, tensor, s_))                                                                   \
        << op << " " << precision_name(p) << " " << tensor << ": rel_l2 " << s_.rel_l2 << " max_abs " << s_.max_abs \
        << " tolerance " << tolerance(op, p) << (s_.finite ? "" : " (non-finite values)");                          \
  } while (0)

// Shapes chosen to hit the awkward cases: T > 32 (rows span several warp passes), an odd
// vocabulary (unaligned GEMM leading dimensions), N = 80 rows (< 64 row chunks of 2).
constexpr int B = 2, T = 40, C = 96, NH = 4, V = 101, N = B * T;

class OpParity : public ::testing::TestWithParam<Precision> {
 protected:
  void SetUp() override {
    GEOLOCO_REQUIRE_GPU();
    stream_ = std::make_unique<Stream>("test");
    blas_ = std::make_unique<CublasHandle>(stream_->get());
    work_ = DeviceBuffer<char>(workspace_bytes(B, T, C, NH, V, 4), "test workspace");
    ctx_ = {stream_->get(), blas_->get(), work_.data(), work_.size()};
  }
  Precision p() const { return GetParam(); }
  vector<float> in(size_t n, uint64_t seed, double scale = 1.0) const {
    return as_precision(random_vec(n, seed, scale), p());
  }
  // Runs fn.template operator()<A>() for the parameter's activation type.
  template <class Fn>
  void dispatch(Fn&& fn) {
    if (p() == Precision::Fp32)
      fn.template operator()<float>();
    else
      fn.template operator()<bf16>();
  }

  std::unique_ptr<Stream> stream_;
  std::unique_ptr<CublasHandle> blas_;
  DeviceBuffer<char> work_;
  OpContext ctx_;
};

vector<int32_t> ids(size_t n, uint64_t seed, int below) {
  Rng r(seed);
  vector<int32_t> v(n);
  for (auto& x : v) x = static_cast<int32_t>(r.below(uint64_t(below)));
  return v;
}

TEST_P(OpParity, Encoder) {
  dispatch([&]<class A>() {
    const auto wte = random_vec(size_t(V) * C, 1, 0.1), wpe = random_vec(size_t(T) * C, 2, 0.1);
    const auto tok = ids(N, 3, V);
    auto d_wte = to_device<float>(wte), d_wpe = to_device<float>(wpe);
    auto d_tok = ids_to_device(tok);
    DeviceBuffer<A> out(size_t(N) * C);
    encoder_forward<A>(ctx_, out.data(), d_tok.data(), d_wte.data(), d_wpe.data(), B, T, C);
    vector<double> want(size_t(N) * C);
    trainer::ref::encoder_forward<double>(want.data(), tok.data(), dv(wte).data(), dv(wpe).data(), B, T, C);
    EXPECT_PARITY("encoder_forward", p(), "out", to_host(out), fv(want));

    const auto dout = in(size_t(N) * C, 4);
    auto dwte0 = random_vec(wte.size(), 5, 0.01), dwpe0 = random_vec(wpe.size(), 6, 0.01);
    auto d_dwte = to_device<float>(dwte0), d_dwpe = to_device<float>(dwpe0);
    auto d_dout = to_device<A>(dout);
    TokenBuckets groups;
    groups.build(tok, V);
    auto d_groups = ids_to_device(vector<int32_t>(groups.packed().begin(), groups.packed().end()));
    const DeviceTokenBuckets dg{d_groups.data(), groups.rows(), groups.groups()};
    encoder_backward<A>(ctx_, d_dwte.data(), d_dwpe.data(), d_dout.data(), dg, B, T, C);
    auto w_dwte = dv(dwte0), w_dwpe = dv(dwpe0);
    trainer::ref::encoder_backward<double>(w_dwte.data(), w_dwpe.data(), dv(dout).data(), tok.data(), B, T, C);
    EXPECT_PARITY("encoder_backward", p(), "dwte", to_host(d_dwte), fv(w_dwte));
    EXPECT_PARITY("encoder_backward", p(), "dwpe", to_host(d_dwpe), fv(w_dwpe));
    // The rows of a token are added in row order, as the float reference does: bit-exact
    // (dout already holds values of the activation type), also when ids collide heavily.
    for (const int distinct : {V, 3}) {
      const auto few = ids(N, 7, distinct);
      groups.build(few, V);
      auto d_few = ids_to_device(vector<int32_t>(groups.packed().begin(), groups.packed().end()));
      auto e_dwte = to_device<float>(dwte0), e_dwpe = to_device<float>(dwpe0);
      encoder_backward<A>(ctx_, e_dwte.data(), e_dwpe.data(), d_dout.data(),
                          DeviceTokenBuckets{d_few.data(), groups.rows(), groups.groups()}, B, T, C);
      auto f_dwte = dwte0, f_dwpe = dwpe0;
      trainer::ref::encoder_backward<float>(f_dwte.data(), f_dwpe.data(), dout.data(), few.data(), B, T, C);
      EXPECT_EQ(to_host(e_dwte), f_dwte) << distinct << " distinct ids";
    }
  });
}

TEST_P(OpParity, LayerNorm) {
  dispatch([&]<class A>() {
    auto x = in(size_t(N) * C, 10, 2.0);
    for (size_t i = 0; i < x.size(); ++i) x[i] = as_precision({x[i] + 0.5f}, p())[0];  // a nonzero mean
    auto w = random_vec(C, 11, 0.1), b = random_vec(C, 12, 0.1);
    for (auto& v : w) v += 1.0f;
    auto d_x = to_device<A>(x);
    auto d_w = to_device<float>(w), d_b = to_device<float>(b);
    DeviceBuffer<A> out(x.size());
    DeviceBuffer<float> mean(N), rstd(N);
    layernorm_forward<A>(ctx_, out.data(), mean.data(), rstd.data(), d_x.data(), d_w.data(), d_b.data(), N, C);
    vector<double> w_out(x.size()), w_mean(N), w_rstd(N);
    trainer::ref::layernorm_forward<double>(w_out.data(), w_mean.data(), w_rstd.data(), dv(x).data(), dv(w).data(),
                                            dv(b).data(), N, C);
    EXPECT_PARITY("layernorm_forward", p(), "out", to_host(out), fv(w_out));
    EXPECT_PARITY("layernorm_forward", p(), "mean", to_host(mean), fv(w_mean));
    EXPECT_PARITY("layernorm_forward", p(), "rstd", to_host(rstd), fv(w_rstd));

    const auto dout = in(x.size(), 13);
    const auto dx0 = in(x.size(), 14, 0.1);
    const auto dw0 = random_vec(C, 15, 0.1), db0 = random_vec(C, 16, 0.1);
    auto d_dout = to_device<A>(dout), d_dx = to_device<A>(dx0);
    auto d_dw = to_device<float>(dw0), d_db = to_device<float>(db0);
    auto d_mean = to_device<float>(fv(w_mean)), d_rstd = to_device<float>(fv(w_rstd));
    layernorm_backward<A>(ctx_, d_dx.data(), d_dw.data(), d_db.data(), d_dout.data(), d_x.data(), d_w.data(),
                          d_mean.data(), d_rstd.data(), N, C);
    auto w_dx = dv(dx0), w_dw = dv(dw0), w_db = dv(db0);
    trainer::ref::layernorm_backward<double>(w_dx.data(), w_dw.data(), w_db.data(), dv(dout).data(), dv(x).data(),
                                             dv(w).data(), dv(fv(w_mean)).data(), dv(fv(w_rstd)).data(), N, C);
    EXPECT_PARITY("layernorm_backward", p(), "dinp", to_host(d_dx), fv(w_dx));
    EXPECT_PARITY("layernorm_backward", p(), "dw", to_host(d_dw), fv(w_dw));
    EXPECT_PARITY("layernorm_backward", p(), "db", to_host(d_db), fv(w_db));
  });
}

// Odd widths: the LayerNorm backward and the bias add take single columns instead of pairs.
TEST_P(OpParity, OddWidthsTakeTheSingleColumnPath) {
  dispatch([&]<class A>() {
    const int c = 33, oc = 35;
    auto x = in(size_t(N) * c, 60, 2.0);
    auto w = random_vec(c, 61, 0.1);
    for (auto& v : w) v += 1.0f;
    vector<double> w_out(x.size()), w_mean(N), w_rstd(N);
    const auto b = random_vec(c, 62, 0.1);
    trainer::ref::layernorm_forward<double>(w_out.data(), w_mean.data(), w_rstd.data(), dv(x).data(), dv(w).data(),
                                            dv(b).data(), N, c);
    const auto dout = in(x.size(), 63), dx0 = in(x.size(), 64, 0.1);
    const auto dw0 = random_vec(c, 65, 0.1), db0 = random_vec(c, 66, 0.1);
    auto d_x = to_device<A>(x), d_dout = to_device<A>(dout), d_dx = to_device<A>(dx0);
    auto d_w = to_device<float>(w), d_dw = to_device<float>(dw0), d_db = to_device<float>(db0);
    auto d_mean = to_device<float>(fv(w_mean)), d_rstd = to_device<float>(fv(w_rstd));
    layernorm_backward<A>(ctx_, d_dx.data(), d_dw.data(), d_db.data(), d_dout.data(), d_x.data(), d_w.data(),
                          d_mean.data(), d_rstd.data(), N, c);
    auto w_dx = dv(dx0), w_dw = dv(dw0), w_db = dv(db0);
    trainer::ref::layernorm_backward<double>(w_dx.data(), w_dw.data(), w_db.data(), dv(dout).data(), dv(x).data(),
                                             dv(w).data(), dv(fv(w_mean)).data(), dv(fv(w_rstd)).data(), N, c);
    EXPECT_PARITY("layernorm_backward", p(), "dinp (odd C)", to_host(d_dx), fv(w_dx));
    EXPECT_PARITY("layernorm_backward", p(), "dw (odd C)", to_host(d_dw), fv(w_dw));

    const auto mw = in(size_t(c) * oc, 67, 0.1);
    const auto bias = random_vec(oc, 68, 0.1);
    auto d_mw = to_device<A>(mw);
    auto d_bias = to_device<float>(bias);
    DeviceBuffer<A> out(size_t(N) * oc);
    matmul_forward<A>(ctx_, out.data(), d_x.data(), d_mw.data(), d_bias.data(), N, c, oc);
    vector<double> want(out.size());
    trainer::ref::matmul_forward<double>(want.data(), dv(x).data(), dv(mw).data(), dv(bias).data(), N, c, oc);
    EXPECT_PARITY("matmul_forward", p(), "out (odd OC)", to_host(out), fv(want));
  });
}

TEST_P(OpParity, Matmul) {
  dispatch([&]<class A>() {
    const int IC = C, OC = 3 * C;
    const auto x = in(size_t(N) * IC, 20), w = in(size_t(IC) * OC, 21, 0.1);
    const auto bias = random_vec(OC, 22, 0.1);
    auto d_x = to_device<A>(x), d_w = to_device<A>(w);
    auto d_bias = to_device<float>(bias);
    DeviceBuffer<A> out(size_t(N) * OC), out_nb(size_t(N) * OC);
    matmul_forward<A>(ctx_, out.data(), d_x.data(), d_w.data(), d_bias.data(), N, IC, OC);
    matmul_forward<A>(ctx_, out_nb.data(), d_x.data(), d_w.data(), nullptr, N, IC, OC);
    vector<double> want(out.size()), want_nb(out.size());
    trainer::ref::matmul_forward<double>(want.data(), dv(x).data(), dv(w).data(), dv(bias).data(), N, IC, OC);
    trainer::ref::matmul_forward<double>(want_nb.data(), dv(x).data(), dv(w).data(), nullptr, N, IC, OC);
    EXPECT_PARITY("matmul_forward", p(), "out", to_host(out), fv(want));
    EXPECT_PARITY("matmul_forward", p(), "out (no bias)", to_host(out_nb), fv(want_nb));

    const auto dout = in(out.size(), 23);
    const auto dx0 = in(x.size(), 24, 0.1);
    const auto dw0 = random_vec(w.size(), 25, 0.1), db0 = random_vec(OC, 26, 0.1);
    auto d_dout = to_device<A>(dout), d_dx = to_device<A>(dx0);
    auto d_dw = to_device<float>(dw0), d_db = to_device<float>(db0);
    matmul_backward<A>(ctx_, d_dx.data(), d_dw.data(), d_db.data(), d_dout.data(), d_x.data(), d_w.data(), N, IC, OC);
    auto w_dx = dv(dx0), w_dw = dv(dw0), w_db = dv(db0);
    trainer::ref::matmul_backward<double>(w_dx.data(), w_dw.data(), w_db.data(), dv(dout).data(), dv(x).data(),
                                          dv(w).data(), N, IC, OC);
    EXPECT_PARITY("matmul_backward", p(), "dinp", to_host(d_dx), fv(w_dx));
    EXPECT_PARITY("matmul_backward", p(), "dw", to_host(d_dw), fv(w_dw));
    EXPECT_PARITY("matmul_backward", p(), "dbias", to_host(d_db), fv(w_db));
  });
}

TEST_P(OpParity, Attention) {
  dispatch([&]<class A>() {
    const auto qkv = in(size_t(N) * 3 * C, 30);
    auto d_qkv = to_device<A>(qkv);
    DeviceBuffer<A> out(size_t(N) * C), att(size_t(B) * NH * T * T);
    attention_forward<A>(ctx_, out.data(), att.data(), d_qkv.data(), B, T, C, NH);
    vector<double> w_out(out.size()), w_att(att.size());
    trainer::ref::attention_forward<double>(w_out.data(), w_att.data(), dv(qkv).data(), B, T, C, NH);
    EXPECT_PARITY("attention_forward", p(), "out", to_host(out), fv(w_out));
    EXPECT_PARITY("attention_forward", p(), "att", to_host(att), fv(w_att));
    // Exactly zero above the diagonal (the backward GEMMs rely on it).
    const auto h_att = to_host(att);
    int nonzero_above = 0;
    for (int r = 0; r < B * NH; ++r)
      for (int t = 0; t < T; ++t)
        for (int s = t + 1; s < T; ++s) nonzero_above += h_att[(size_t(r) * T + t) * T + s] != 0.0f;
    EXPECT_EQ(nonzero_above, 0);

    const auto dout = in(out.size(), 31);
    const auto att_in = as_precision(fv(w_att), p());
    const auto dqkv0 = in(qkv.size(), 32, 0.1);
    auto d_dout = to_device<A>(dout), d_att = to_device<A>(att_in), d_dqkv = to_device<A>(dqkv0);
    attention_backward<A>(ctx_, d_dqkv.data(), d_dout.data(), d_qkv.data(), d_att.data(), B, T, C, NH);
    auto w_dqkv = dv(dqkv0);
    trainer::ref::attention_backward<double>(w_dqkv.data(), dv(dout).data(), dv(qkv).data(), dv(att_in).data(), B, T, C,
                                             NH);
    EXPECT_PARITY("attention_backward", p(), "dqkv", to_host(d_dqkv), fv(w_dqkv));
  });
}

// The fused attention (bf16 only; FlashAttention-2 on tensor cores): output, log-sum-exp and
// the gradient of qkv against the double reference, for head sizes 16, 32 and 64, with T = 100
// (no multiple of any tile: ragged last query and key tiles), adding into dqkv and, into a
// fresh buffer, overwriting it (every element must be written).
TEST(FusedAttentionParity, MatchesTheReferenceForEveryHeadSize) {
  GEOLOCO_REQUIRE_GPU();
  const Precision bf = Precision::Bf16;
  const int b_ = 2, t_ = 100, n_ = b_ * t_;
  for (const auto& [c_, nh_] : {std::pair{64, 4}, std::pair{128, 4}, std::pair{128, 2}}) {
    const int hs = c_ / nh_;
    SCOPED_TRACE("head size " + std::to_string(hs));
    ASSERT_TRUE(fused_attention_fits(c_, nh_));
    Stream st("test");
    CublasHandle blas(st.get());
    DeviceBuffer<char> work(workspace_bytes(b_, t_, c_, nh_, 64, 2), "test workspace");
    const OpContext ctx{st.get(), blas.get(), work.data(), work.size()};
    const auto qkv = as_precision(random_vec(size_t(n_) * 3 * c_, 30 + hs), bf);
    auto d_qkv = to_device<bf16>(qkv);
    DeviceBuffer<bf16> out(size_t(n_) * c_);
    DeviceBuffer<float> lse(size_t(b_) * nh_ * t_);
    attention_forward_fused(ctx, out.data(), lse.data(), d_qkv.data(), b_, t_, c_, nh_);
    vector<double> w_out(out.size()), w_att(size_t(b_) * nh_ * t_ * t_);
    trainer::ref::attention_forward<double>(w_out.data(), w_att.data(), dv(qkv).data(), b_, t_, c_, nh_);
    EXPECT_PARITY("attention_forward", bf, "out (fused)", to_host(out), fv(w_out));
    vector<double> w_lse(lse.size());
    const double scale = 1.0 / std::sqrt(double(hs));
    for (int b = 0; b < b_; ++b)
      for (int h = 0; h < nh_; ++h)
        for (int t = 0; t < t_; ++t) {
          double mx = -1e300, sum = 0;
          vector<double> sc(size_t(t) + 1);
          for (int j = 0; j <= t; ++j) {
            double d = 0;
            for (int e = 0; e < hs; ++e)
              d += double(qkv[(size_t(b) * t_ + t) * 3 * c_ + size_t(h) * hs + e]) *
                   double(qkv[(size_t(b) * t_ + j) * 3 * c_ + c_ + size_t(h) * hs + e]);
            sc[size_t(j)] = d * scale;
            mx = std::max(mx, sc[size_t(j)]);
          }
          for (double x : sc) sum += std::exp(x - mx);
          w_lse[(size_t(b) * nh_ + h) * t_ + t] = mx + std::log(sum);
        }
    EXPECT_PARITY("attention_forward", Precision::Fp32, "lse (fused)", to_host(lse), fv(w_lse));

    const auto dout = as_precision(random_vec(out.size(), 31 + hs), bf);
    const auto dqkv0 = as_precision(random_vec(qkv.size(), 32 + hs, 0.1), bf);
    auto d_dout = to_device<bf16>(dout), d_dqkv = to_device<bf16>(dqkv0);
    attention_backward_fused(ctx, d_dqkv.data(), d_dout.data(), d_qkv.data(), out.data(), lse.data(), b_, t_, c_, nh_);
    auto w_dqkv = dv(dqkv0);
    trainer::ref::attention_backward<double>(w_dqkv.data(), dv(dout).data(), dv(qkv).data(), w_att.data(), b_, t_, c_,
                                             nh_);
    EXPECT_PARITY("attention_backward", bf, "dqkv (fused, accumulate)", to_host(d_dqkv), fv(w_dqkv));

    DeviceBuffer<bf16> fresh(qkv.size());
    attention_backward_fused(ctx, fresh.data(), d_dout.data(), d_qkv.data(), out.data(), lse.data(), b_, t_, c_, nh_,
                             /*overwrite=*/true);
    vector<double> w_fresh(qkv.size(), 0.0);
    trainer::ref::attention_backward<double>(w_fresh.data(), dv(dout).data(), dv(qkv).data(), w_att.data(), b_, t_, c_,
                                             nh_);
    EXPECT_PARITY("attention_backward", bf, "dqkv (fused, overwrite)", to_host(fresh), fv(w_fresh));
  }
  EXPECT_FALSE(fused_attention_fits(96, 4));   // head size 24
  EXPECT_FALSE(fused_attention_fits(512, 4));  // head size 128
}

TEST_P(OpParity, GeluAndResidual) {
  dispatch([&]<class A>() {
    const int64_t n = int64_t(N) * 4 * C;
    const auto x = in(size_t(n), 40, 2.0), y = in(size_t(n), 41);
    auto d_x = to_device<A>(x), d_y = to_device<A>(y);
    DeviceBuffer<A> g(static_cast<size_t>(n)), r(static_cast<size_t>(n));
    gelu_forward<A>(ctx_, g.data(), d_x.data(), n);
    residual_forward<A>(ctx_, r.data(), d_x.data(), d_y.data(), n);
    vector<double> w_g(static_cast<size_t>(n)), w_r(static_cast<size_t>(n));
    trainer::ref::gelu_forward<double>(w_g.data(), dv(x).data(), n);
    trainer::ref::residual_forward<double>(w_r.data(), dv(x).data(), dv(y).data(), n);
    EXPECT_PARITY("gelu_forward", p(), "out", to_host(g), fv(w_g));
    EXPECT_PARITY("residual_forward", p(), "out", to_host(r), fv(w_r));

    const auto dout = in(size_t(n), 42), d0 = in(size_t(n), 43, 0.1), e0 = in(size_t(n), 44, 0.1);
    auto d_dout = to_device<A>(dout), d_dx = to_device<A>(d0), d_da = to_device<A>(d0), d_db = to_device<A>(e0);
    gelu_backward<A>(ctx_, d_dx.data(), d_x.data(), d_dout.data(), n);
    residual_backward<A>(ctx_, d_da.data(), d_db.data(), d_dout.data(), n);
    auto w_dx = dv(d0), w_da = dv(d0), w_db = dv(e0);
    trainer::ref::gelu_backward<double>(w_dx.data(), dv(x).data(), dv(dout).data(), n);
    trainer::ref::residual_backward<double>(w_da.data(), w_db.data(), dv(dout).data(), n);
    EXPECT_PARITY("gelu_backward", p(), "dinp", to_host(d_dx), fv(w_dx));
    EXPECT_PARITY("residual_backward", p(), "da", to_host(d_da), fv(w_da));
    EXPECT_PARITY("residual_backward", p(), "db", to_host(d_db), fv(w_db));
  });
}

TEST_P(OpParity, LmHead) {
  dispatch([&]<class A>() {
    const auto x = in(size_t(N) * C, 50), wte = in(size_t(V) * C, 51, 0.1);
    auto d_x = to_device<A>(x), d_wte = to_device<A>(wte);
    DeviceBuffer<A> logits(size_t(N) * V);
    lm_head_forward<A>(ctx_, logits.data(), d_x.data(), d_wte.data(), N, C, V);
    vector<double> want(logits.size());
    trainer::ref::lm_head_forward<double>(want.data(), dv(x).data(), dv(wte).data(), N, C, V);
    EXPECT_PARITY("lm_head_forward", p(), "logits", to_host(logits), fv(want));

    const auto dl = in(logits.size(), 52), dx0 = in(x.size(), 53, 0.1);
    const auto dw0 = random_vec(wte.size(), 54, 0.1);
    auto d_dl = to_device<A>(dl), d_dx = to_device<A>(dx0);
    auto d_dw = to_device<float>(dw0);
    lm_head_backward<A>(ctx_, d_dx.data(), d_dw.data(), d_dl.data(), d_x.data(), d_wte.data(), N, C, V);
    auto w_dx = dv(dx0), w_dw = dv(dw0);
    trainer::ref::lm_head_backward<double>(w_dx.data(), w_dw.data(), dv(dl).data(), dv(x).data(), dv(wte).data(), N, C,
                                           V);
    EXPECT_PARITY("lm_head_backward", p(), "dinp", to_host(d_dx), fv(w_dx));
    EXPECT_PARITY("lm_head_backward", p(), "dwte", to_host(d_dw), fv(w_dw));
  });
}

TEST_P(OpParity, CrossEntropy) {
  dispatch([&]<class A>() {
    const auto logits = in(size_t(N) * V, 60, 3.0);
    const auto tgt = ids(N, 61, V);
    auto d_l = to_device<A>(logits);  // probabilities overwrite it in place, as in the model
    auto d_t = ids_to_device(tgt);
    DeviceBuffer<float> losses(N);
    crossentropy_forward<A>(ctx_, d_l.data(), losses.data(), d_l.data(), d_t.data(), N, V);
    const float mean = mean_loss_to_host(ctx_, losses.data(), N);
    vector<double> w_p(logits.size()), w_loss(N);
    const double w_mean =
        trainer::ref::crossentropy_forward<double>(w_p.data(), w_loss.data(), dv(logits).data(), tgt.data(), N, V);
    EXPECT_PARITY("crossentropy_forward", p(), "probs", to_host(d_l), fv(w_p));
    EXPECT_PARITY("crossentropy_forward", p(), "losses", to_host(losses), fv(w_loss));
    EXPECT_PARITY("crossentropy_forward", p(), "mean loss", vector<float>{mean}, vector<float>{float(w_mean)});

    const auto probs = as_precision(fv(w_p), p());
    const float dloss = 0.37f / N;
    auto d_p = to_device<A>(probs);
    crossentropy_backward<A>(ctx_, d_p.data(), d_p.data(), d_t.data(), dloss, N, V);
    vector<double> w_d(probs.size());
    trainer::ref::crossentropy_backward<double>(w_d.data(), dv(probs).data(), tgt.data(), double(dloss), N, V);
    EXPECT_PARITY("crossentropy_backward", p(), "dlogits", to_host(d_p), fv(w_d));
  });
}

// The model pads logit rows to a multiple of 64 (aligned bf16 GEMMs). Padding is filled with
// NaN here: if any op read it, the NaN would reach the compared results.
TEST_P(OpParity, LmHeadAndCrossEntropyWithPaddedRows) {
  dispatch([&]<class A>() {
    const int ldv = V + 11;
    auto pad = [&](const vector<float>& rows) {  // [N, V] -> [N, ldv] with NaN padding
      vector<float> out(size_t(N) * ldv, std::numeric_limits<float>::quiet_NaN());
      for (int n = 0; n < N; ++n)
        for (int v = 0; v < V; ++v) out[size_t(n) * ldv + v] = rows[size_t(n) * V + v];
      return out;
    };
    auto unpad = [&](const vector<float>& padded) {
      vector<float> out(size_t(N) * V);
      for (int n = 0; n < N; ++n)
        for (int v = 0; v < V; ++v) out[size_t(n) * V + v] = padded[size_t(n) * ldv + v];
      return out;
    };
    const auto x = in(size_t(N) * C, 150), wte = in(size_t(V) * C, 151, 0.1);
    const auto tgt = ids(N, 152, V);
    auto d_x = to_device<A>(x), d_wte = to_device<A>(wte);
    auto d_t = ids_to_device(tgt);
    auto d_logits = to_device<A>(pad(vector<float>(size_t(N) * V, 0.0f)));
    lm_head_forward<A>(ctx_, d_logits.data(), d_x.data(), d_wte.data(), N, C, V, ldv);
    const auto logits = unpad(to_host(d_logits));
    vector<double> w_logits(size_t(N) * V);
    trainer::ref::lm_head_forward<double>(w_logits.data(), dv(x).data(), dv(wte).data(), N, C, V);
    EXPECT_PARITY("lm_head_forward", p(), "logits (padded rows)", logits, fv(w_logits));

    DeviceBuffer<float> losses(N);
    crossentropy_forward<A>(ctx_, d_logits.data(), losses.data(), d_logits.data(), d_t.data(), N, V, ldv);
    const auto probs_padded = to_host(d_logits);
    vector<double> w_p(size_t(N) * V), w_loss(N);
    trainer::ref::crossentropy_forward<double>(w_p.data(), w_loss.data(), dv(logits).data(), tgt.data(), N, V);
    EXPECT_PARITY("crossentropy_forward", p(), "probs (padded rows)", unpad(probs_padded), fv(w_p));
    EXPECT_PARITY("crossentropy_forward", p(), "losses (padded rows)", to_host(losses), fv(w_loss));
    int written_padding = 0;
    for (int n = 0; n < N; ++n)
      for (int v = V; v < ldv; ++v) written_padding += !std::isnan(probs_padded[size_t(n) * ldv + v]);
    EXPECT_EQ(written_padding, 0) << "padding columns were written";

    const float dloss = 1.0f / N;
    crossentropy_backward<A>(ctx_, d_logits.data(), d_logits.data(), d_t.data(), dloss, N, V, ldv);
    const auto probs_in = unpad(probs_padded);
    vector<double> w_d(size_t(N) * V);
    trainer::ref::crossentropy_backward<double>(w_d.data(), dv(probs_in).data(), tgt.data(), double(dloss), N, V);
    const auto dlogits = unpad(to_host(d_logits));
    EXPECT_PARITY("crossentropy_backward", p(), "dlogits (padded rows)", dlogits, fv(w_d));

    const auto dx0 = in(x.size(), 153, 0.1);
    const auto dw0 = random_vec(wte.size(), 154, 0.1);
    auto d_dx = to_device<A>(dx0);
    auto d_dw = to_device<float>(dw0);
    lm_head_backward<A>(ctx_, d_dx.data(), d_dw.data(), d_logits.data(), d_x.data(), d_wte.data(), N, C, V, ldv);
    auto w_dx = dv(dx0), w_dw = dv(dw0);
    trainer::ref::lm_head_backward<double>(w_dx.data(), w_dw.data(), dv(dlogits).data(), dv(x).data(), dv(wte).data(),
                                           N, C, V);
    EXPECT_PARITY("lm_head_backward", p(), "dinp (padded rows)", to_host(d_dx), fv(w_dx));
    EXPECT_PARITY("lm_head_backward", p(), "dwte (padded rows)", to_host(d_dw), fv(w_dw));
    const auto dlogits_padded = to_host(d_logits);
    int nonzero_padding = 0;
    for (int n = 0; n < N; ++n)
      for (int v = V; v < ldv; ++v) nonzero_padding += dlogits_padded[size_t(n) * ldv + v] != 0.0f;
    EXPECT_EQ(nonzero_padding, 0) << "crossentropy_backward leaves the padding columns of dlogits zero";

    // wte padded to ldv rows (zero past V): the GEMMs run on the padded width, same results.
    vector<float> wte_padded(size_t(ldv) * C, 0.0f);
    std::copy(wte.begin(), wte.end(), wte_padded.begin());
    auto d_wte_padded = to_device<A>(wte_padded);
    auto d_logits2 = to_device<A>(pad(vector<float>(size_t(N) * V, 0.0f)));
    lm_head_forward<A>(ctx_, d_logits2.data(), d_x.data(), d_wte_padded.data(), N, C, V, ldv, true);
    const auto logits2 = to_host(d_logits2);
    EXPECT_PARITY("lm_head_forward", p(), "logits (padded wte)", unpad(logits2), fv(w_logits));
    int padding_not_zero = 0;
    for (int n = 0; n < N; ++n)
      for (int v = V; v < ldv; ++v) padding_not_zero += logits2[size_t(n) * ldv + v] != 0.0f;
    EXPECT_EQ(padding_not_zero, 0) << "the padded forward writes zeros past V";
    auto d_dx2 = to_device<A>(dx0);
    auto d_dw2 = to_device<float>(dw0);
    lm_head_backward<A>(ctx_, d_dx2.data(), d_dw2.data(), d_logits.data(), d_x.data(), d_wte_padded.data(), N, C, V,
                        ldv, false, true);
    EXPECT_PARITY("lm_head_backward", p(), "dinp (padded wte)", to_host(d_dx2), fv(w_dx));
    EXPECT_PARITY("lm_head_backward", p(), "dwte (padded wte)", to_host(d_dw2), fv(w_dw));
  });
}

TEST_P(OpParity, WorkspaceTooSmallIsAnError) {
  dispatch([&]<class A>() {
    OpContext small = ctx_;
    small.work_bytes = 1024;
    DeviceBuffer<A> qkv(size_t(N) * 3 * C), out(size_t(N) * C), att(size_t(B) * NH * T * T);
    EXPECT_THROW(attention_forward<A>(small, out.data(), att.data(), qkv.data(), B, T, C, NH), geoloco::Error);
  });
}

INSTANTIATE_TEST_SUITE_P(Precisions, OpParity, ::testing::Values(Precision::Fp32, Precision::Bf16),
                         [](const auto& info) { return std::string(precision_name(info.param)); });

TEST(GradNormParity, SumOfSquaresAndScale) {
  GEOLOCO_REQUIRE_GPU();
  const auto v = random_vec(1000003, 75, 0.01);
  Stream s;
  DeviceBuffer<char> work(4096);
  OpContext ctx{s.get(), nullptr, work.data(), work.size()};
  auto d = to_device<float>(v);
  double want = 0;
  for (float x : v) want += double(x) * x;
  const double got = sum_squares_to_host(ctx, d.data(), int64_t(v.size()));
  EXPECT_PARITY("grad_norm", Precision::Fp32, "sum of squares", vector<float>{float(got)}, vector<float>{float(want)});
  EXPECT_EQ(got, sum_squares_to_host(ctx, d.data(), int64_t(v.size())));  // same bits again
  scale_inplace(ctx, d.data(), int64_t(v.size()), 0.5f);
  const auto h = to_host(d);
  for (size_t i = 0; i < v.size(); i += 997) ASSERT_EQ(h[i], v[i] * 0.5f);  // exact: a power of two
}

TEST(CastParity, Bf16CastMatchesTheHostHelperBitForBit) {
  GEOLOCO_REQUIRE_GPU();
  auto v = random_vec(4099, 70, 10.0);
  v[0] = 1.0f + std::ldexp(1.0f, -8);  // a tie
  v[1] = std::numeric_limits<float>::infinity();
  v[2] = -0.0f;
  v[3] = std::numeric_limits<float>::max();
  Stream s;
  OpContext ctx{s.get(), nullptr, nullptr, 0};
  auto d_in = to_device<float>(v);
  DeviceBuffer<bf16> d_out(v.size());
  cast_to_bf16(ctx, d_out.data(), d_in.data(), int64_t(v.size()));
  DeviceBuffer<float> back(v.size());
  cast_to_float(ctx, back.data(), d_out.data(), int64_t(v.size()));
  const auto got = to_host(back);
  vector<float> want(v.size());
  for (size_t i = 0; i < v.size(); ++i) want[i] = round_to_bf16(v[i]);
  size_t mismatches = 0;
  for (size_t i = 0; i < v.size(); ++i)
    mismatches += std::bit_cast<uint32_t>(got[i]) != std::bit_cast<uint32_t>(want[i]);
  EXPECT_EQ(mismatches, 0u);
  // compare() treats the infinity as non-finite: check the finite part through the log.
  vector<float> g(got.begin() + 4, got.end()), w(want.begin() + 4, want.end());
  EXPECT_PARITY("cast_bf16", Precision::Bf16, "values", g, w);
}

}  // namespace
}  // namespace geoloco::cuda::testing

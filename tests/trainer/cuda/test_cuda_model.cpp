// Whole-model tests of the GPU path: CudaGpt loss, probabilities and gradients against the
// CPU model (trainer::Gpt, reference kernels), a short AdamW training run whose loss curve
// must track the CPU run, CudaInnerOptimizer against trainer::AdamW, determinism, the gradient-ready
// hook, pseudo-gradient staging, and the typed errors (out of memory, bad input, misuse).
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "gpu_test_util.hpp"
#include "trainer/cuda/cuda_inner_optimizer.hpp"
#include "trainer/cuda/cuda_gpt.hpp"
#include "trainer/cuda/grad_overlap.hpp"
#include "trainer/cuda/op_profile.hpp"
#include "trainer/cuda/staging.hpp"
#include "trainer/model/gpt.hpp"
#include "trainer/optim/inner_optimizer.hpp"

namespace geoloco::cuda::testing {
namespace {

using std::vector;

trainer::ModelConfig small_model() {
  trainer::ModelConfig c;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 64;
  c.block_size = 48;
  c.vocab_size = 97;
  return c;
}

vector<int32_t> tokens(size_t n, uint64_t seed, int V) {
  Rng r(seed);
  vector<int32_t> v(n);
  for (auto& x : v) x = static_cast<int32_t>(r.below(uint64_t(V)));
  return v;
}

vector<float> download(std::span<const float> dev) {
  check_cuda(cudaDeviceSynchronize(), "test synchronize");
  vector<float> h(dev.size());
  check_cuda(cudaMemcpy(h.data(), dev.data(), h.size() * 4, cudaMemcpyDeviceToHost), "test download");
  return h;
}

// Precision x attention kernel: fp32 (materialized), bf16 materialized, bf16 fused.
struct ModelCase {
  Precision p;
  AttentionKernel attention;
};

class ModelParity : public ::testing::TestWithParam<ModelCase> {
 protected:
  void SetUp() override { GEOLOCO_REQUIRE_GPU(); }
  // The model under test, with the kernel the case names actually in use.
  // Suffix of the parity log's tensor names, so the two bf16 cases stay apart.
  std::string tag() const { return GetParam().attention == AttentionKernel::Fused ? " (fused attention)" : ""; }
  std::unique_ptr<CudaGpt> make(const trainer::ModelConfig& cfg) const {
    auto m = std::make_unique<CudaGpt>(cfg, GetParam().p, GetParam().attention);
    EXPECT_EQ(m->fused_attention(), GetParam().attention == AttentionKernel::Fused);
    return m;
  }
};

TEST_P(ModelParity, LossProbsAndGradientsMatchTheCpuModel) {
  const Precision p = GetParam().p;
  const auto cfg = small_model();
  const int B = 3, T = 48, N = B * T;
  trainer::Gpt cpu(cfg, trainer::KernelPath::Reference);
  vector<float> params(size_t(cpu.layout().total())), grads(params.size(), 0.0f);
  trainer::Gpt::init_params(cpu.layout(), params, 7);
  const auto in = tokens(N, 8, cfg.vocab_size), tg = tokens(N, 9, cfg.vocab_size);
  const float cpu_loss = cpu.forward(params, in.data(), tg.data(), B, T);
  const auto cpu_probs = vector<float>(cpu.probs().begin(), cpu.probs().end());
  cpu.backward(params, grads, 0.5f);

  auto gpu_model = make(cfg);
  CudaGpt& gpu = *gpu_model;
  auto d_params = to_device<float>(params);
  DeviceBuffer<float> d_grads(params.size());
  check_cuda(cudaMemset(d_grads.data(), 0, d_grads.size() * 4), "zero grads");
  // Legacy-stream memset: finish it before the model's non-blocking stream reads the buffer.
  check_cuda(cudaDeviceSynchronize(), "zero grads");
  const float gpu_loss = gpu.forward(d_params.span(), in.data(), tg.data(), B, T);
  const auto gpu_probs = gpu.probs_to_host();
  vector<int> hook_blocks;
  gpu.backward(d_params.span(), d_grads.span(), 0.5f, [&](int block, cudaStream_t s) {
    EXPECT_EQ(s, gpu.stream());
    hook_blocks.push_back(block);
  });
  const auto g = download(d_grads.span());

  const ErrorStats ls = compare(vector<float>{gpu_loss}, vector<float>{cpu_loss});
  EXPECT_TRUE(record_parity("model.loss", p, "loss" + tag(), ls)) << "gpu " << gpu_loss << " cpu " << cpu_loss;
  const ErrorStats ps = compare(gpu_probs, cpu_probs);
  EXPECT_TRUE(record_parity("model.probs", p, "probs" + tag(), ps)) << "rel_l2 " << ps.rel_l2;
  const ErrorStats gs = compare(g, grads);
  EXPECT_TRUE(record_parity("model.grads", p, "all" + tag(), gs)) << "rel_l2 " << gs.rel_l2;
  // Per tensor, like llm.c's test_gpt2: a wrong tensor cannot hide in the global norm.
  for (const auto& v : cpu.layout().views()) {
    const std::span<const float> a(g.data() + v.offset, size_t(v.numel)), b(grads.data() + v.offset, size_t(v.numel));
    const ErrorStats s = compare(a, b);
    EXPECT_TRUE(record_parity("model.grads", p, v.name + tag(), s)) << v.name << " rel_l2 " << s.rel_l2;
  }
  EXPECT_EQ(hook_blocks, (vector<int>{1, 0, -1}));
}

TEST_P(ModelParity, ShortTrainingRunTracksTheCpuCurve) {
  const Precision p = GetParam().p;
  const auto cfg = small_model();
  const int B = 4, T = 32, N = B * T, steps = 10;
  trainer::OptimizerConfig ocfg;
  ocfg.lr = 1e-3;
  trainer::Gpt cpu(cfg, trainer::KernelPath::Fast);
  vector<float> params(size_t(cpu.layout().total())), grads(params.size());
  trainer::Gpt::init_params(cpu.layout(), params, 11);
  trainer::InnerOptimizer cpu_opt(ocfg, cpu.layout(), 0, cpu.layout().total());

  auto gpu_model = make(cfg);
  CudaGpt& gpu = *gpu_model;
  auto d_params = to_device<float>(params);
  DeviceBuffer<float> d_grads(params.size());
  CudaInnerOptimizer gpu_opt(ocfg, gpu.layout(), 0, gpu.layout().total());

  // Two fixed batches with a learnable rule (target = 7 * input + 3 mod V), repeated: the loss
  // must fall well below its start (on the CPU, the same run goes 4.59 -> 3.58 in 10 steps).
  vector<vector<int32_t>> xs, ys;
  for (int i = 0; i < 2; ++i) {
    xs.push_back(tokens(N, 100 + i, cfg.vocab_size));
    vector<int32_t> y(xs.back().size());
    for (size_t j = 0; j < y.size(); ++j) y[j] = (xs.back()[j] * 7 + 3) % cfg.vocab_size;
    ys.push_back(y);
  }
  vector<float> cpu_curve, gpu_curve;
  for (int s = 0; s < steps; ++s) {
    const auto& x = xs[s % 2];
    const auto& y = ys[s % 2];
    std::fill(grads.begin(), grads.end(), 0.0f);
    cpu_curve.push_back(cpu.forward(params, x.data(), y.data(), B, T));
    cpu.backward(params, grads);
    cpu_opt.step(params, grads, ocfg.lr);

    check_cuda(cudaMemsetAsync(d_grads.data(), 0, d_grads.size() * 4, gpu.stream()), "zero grads");
    gpu_curve.push_back(gpu.forward(d_params.span(), x.data(), y.data(), B, T));
    gpu.backward(d_params.span(), d_grads.span());
    gpu_opt.step(d_params.span(), d_grads.span(), ocfg.lr, gpu.stream());
  }
  const ErrorStats s = compare(gpu_curve, cpu_curve);
  std::string curves;
  for (int i = 0; i < steps; ++i) curves += fmt::format(" {:.4f}/{:.4f}", gpu_curve[i], cpu_curve[i]);
  EXPECT_TRUE(record_parity("train.loss", p, "curve" + tag(), s)) << "gpu/cpu:" << curves;
  EXPECT_LT(gpu_curve.back(), gpu_curve.front() * 0.9f) << curves;
}

TEST_P(ModelParity, SameInputsGiveTheSameBits) {
  const auto cfg = small_model();
  const int B = 2, T = 48;
  vector<float> params(size_t(trainer::ParamLayout(cfg).total()));
  trainer::Gpt::init_params(trainer::ParamLayout(cfg), params, 3);
  const auto x = tokens(B * T, 4, cfg.vocab_size), y = tokens(B * T, 5, cfg.vocab_size);
  auto d_params = to_device<float>(params);
  vector<vector<float>> runs;
  vector<float> losses;
  for (int r = 0; r < 2; ++r) {
    auto gpu_model = make(cfg);
    CudaGpt& gpu = *gpu_model;
    DeviceBuffer<float> d_grads(params.size());
    check_cuda(cudaMemset(d_grads.data(), 0, d_grads.size() * 4), "zero grads");
    // Legacy-stream memset: finish it before the model's non-blocking stream reads the buffer.
    check_cuda(cudaDeviceSynchronize(), "zero grads");
    losses.push_back(gpu.forward(d_params.span(), x.data(), y.data(), B, T));
    gpu.backward(d_params.span(), d_grads.span());
    runs.push_back(download(d_grads.span()));
  }
  EXPECT_EQ(std::bit_cast<uint32_t>(losses[0]), std::bit_cast<uint32_t>(losses[1]));
  EXPECT_TRUE(std::memcmp(runs[0].data(), runs[1].data(), runs[0].size() * 4) == 0) << "gradients differ run to run";
}

INSTANTIATE_TEST_SUITE_P(Precisions, ModelParity,
                         ::testing::Values(ModelCase{Precision::Fp32, AttentionKernel::Materialized},
                                           ModelCase{Precision::Bf16, AttentionKernel::Materialized},
                                           ModelCase{Precision::Bf16, AttentionKernel::Fused}),
                         [](const auto& info) {
                           return std::string(precision_name(info.param.p)) +
                                  (info.param.attention == AttentionKernel::Fused ? "_fused" : "");
                         });

// The op profile of one training step marks every op: each op kind is counted as often as
// the model runs it (L blocks), the marks do not change the result, and the times add up.
TEST_P(ModelParity, OpProfileCountsEveryOpOfAStep) {
  const auto cfg = small_model();
  const int B = 2, T = 48, L = cfg.n_layer;
  vector<float> params(size_t(trainer::ParamLayout(cfg).total()));
  trainer::Gpt::init_params(trainer::ParamLayout(cfg), params, 3);
  const auto x = tokens(B * T, 4, cfg.vocab_size), y = tokens(B * T, 5, cfg.vocab_size);
  auto d_params = to_device<float>(params);
  auto gpu_model = make(cfg);
  CudaGpt& gpu = *gpu_model;
  DeviceBuffer<float> plain(params.size()), profiled(params.size());
  check_cuda(cudaMemset(plain.data(), 0, plain.size() * 4), "zero grads");
  check_cuda(cudaMemset(profiled.data(), 0, profiled.size() * 4), "zero grads");
  check_cuda(cudaDeviceSynchronize(), "zero grads");
  const float loss = gpu.forward(d_params.span(), x.data(), y.data(), B, T);
  gpu.backward(d_params.span(), plain.span());

  OpProfile profile(gpu.stream());
  gpu.set_profile(&profile);
  const float profiled_loss = gpu.forward(d_params.span(), x.data(), y.data(), B, T);
  int hooks = 0;
  gpu.backward(d_params.span(), profiled.span(), 1.0f, [&](int, cudaStream_t) { ++hooks; });
  const OpTimes t = profile.stop();
  gpu.set_profile(nullptr);
  EXPECT_EQ(profile.marks(), 0u);
  EXPECT_EQ(std::bit_cast<uint32_t>(loss), std::bit_cast<uint32_t>(profiled_loss));
  const auto a = download(plain.span()), b = download(profiled.span());
  EXPECT_TRUE(std::memcmp(a.data(), b.data(), a.size() * 4) == 0) << "profiling changed the gradients";

  std::map<std::string, int64_t> want = {
      {"tokens.upload", 1},       {"encoder.fwd", 1},           {"layernorm.fwd", 2 * L + 1},
      {"matmul.qkv.fwd", L},      {"attention.fwd", L},         {"matmul.attproj.fwd", L},
      {"residual.fwd", 2 * L},    {"matmul.fc.fwd", L},         {"gelu.fwd", L},
      {"matmul.fcproj.fwd", L},   {"lm_head.fwd", 1},           {"crossentropy.fwd", 1},
      {"loss.to_host", 1},        {"crossentropy.bwd", 1},      {"lm_head.bwd", 1},
      {"memset.bwd", 1},          {"layernorm.bwd", 2 * L + 1}, {"layernorm.bwd.params", 2 * L + 1},
      {"matmul.bias.bwd", 4 * L}, {"matmul.fcproj.bwd", L},     {"gelu.bwd", L},
      {"matmul.fc.bwd", L},       {"matmul.attproj.bwd", L},    {"attention.bwd", L},
      {"matmul.qkv.bwd", L},      {"grad_hook", L + 1},         {"encoder.bwd", 1}};
  if (GetParam().p == Precision::Bf16) want["cast_bf16"] = 1;
  std::map<std::string, int64_t> got;
  double sum = 0;
  for (const auto& r : t.rows()) {
    got[r.op] = r.calls;
    sum += r.ms;
    EXPECT_GE(r.ms, 0.0) << r.op;
  }
  EXPECT_EQ(got, want);
  EXPECT_EQ(hooks, L + 1);
  EXPECT_NEAR(sum, t.total_ms(), 1e-9 * std::max(1.0, sum));
  EXPECT_GT(t.total_ms(), 0.0);
}

TEST(CudaModel, MisuseAndBadInputAreTypedErrors) {
  GEOLOCO_REQUIRE_GPU();
  const auto cfg = small_model();
  CudaGpt gpu(cfg, Precision::Fp32);
  vector<float> params(size_t(gpu.layout().total()));
  trainer::Gpt::init_params(gpu.layout(), params, 1);
  auto d_params = to_device<float>(params);
  DeviceBuffer<float> d_grads(params.size());
  auto x = tokens(32, 1, cfg.vocab_size), y = tokens(32, 2, cfg.vocab_size);
  EXPECT_THROW(gpu.backward(d_params.span(), d_grads.span()), geoloco::Error);  // no forward yet
  x[5] = cfg.vocab_size;
  EXPECT_THROW(gpu.forward(d_params.span(), x.data(), y.data(), 1, 32), InputError);
  x[5] = 0;
  EXPECT_THROW(gpu.forward(d_params.span(), x.data(), y.data(), 1, cfg.block_size + 1), InputError);
  gpu.evaluate(d_params.span(), x.data(), y.data(), 1, 32);
  EXPECT_THROW(gpu.backward(d_params.span(), d_grads.span()), geoloco::Error);  // evaluate is not for backward
  gpu.forward(d_params.span(), x.data(), y.data(), 1, 32);
  gpu.backward(d_params.span(), d_grads.span());
  EXPECT_THROW(gpu.backward(d_params.span(), d_grads.span()), geoloco::Error);  // one backward per forward
  EXPECT_THROW(gpu.probs_to_host(), geoloco::Error);                            // consumed by backward
}

TEST(CudaErrorsOnDevice, OutOfMemoryIsTyped) {
  GEOLOCO_REQUIRE_GPU();
  try {
    DeviceBuffer<float> huge(size_t(1) << 42, "a 16 TiB test buffer");
    FAIL() << "16 TiB allocation succeeded";
  } catch (const CudaOutOfMemory& e) {
    EXPECT_NE(std::string(e.what()).find("a 16 TiB test buffer"), std::string::npos) << e.what();
    EXPECT_GE(e.device(), 0);
  }
  // The device stays usable afterwards.
  DeviceBuffer<float> ok(1024);
  EXPECT_EQ(ok.size(), 1024u);
}

TEST(CudaErrorsOnDevice, MoreRanksThanGpusIsAConfigError) {
  GEOLOCO_REQUIRE_GPU();
  const int n = device_count();
  EXPECT_THROW(select_device(n, n + 1), ConfigError);
  const DeviceInfo d = select_device(0, 1);
  EXPECT_EQ(d.index, 0);
  EXPECT_FALSE(d.name.empty());
  EXPECT_GT(d.total_memory, 0u);
}

TEST(CudaAdamWParity, MatchesTheCpuOptimizer) {
  GEOLOCO_REQUIRE_GPU();
  const auto cfg = small_model();
  const trainer::ParamLayout layout(cfg);
  trainer::OptimizerConfig ocfg;
  ocfg.lr = 3e-3;
  ocfg.weight_decay = 0.1;
  // A shard that starts and ends inside tensors, so both decay and no-decay ranges are cut.
  const int64_t begin = layout.block(0).begin + 17, end = layout.block(1).end - 5;
  trainer::InnerOptimizer cpu(ocfg, layout, begin, end);
  CudaInnerOptimizer gpu(ocfg, layout, begin, end);
  auto params = random_vec(size_t(layout.total()), 80, 0.05);
  auto d_params = to_device<float>(params);
  Stream s;
  for (int step = 0; step < 3; ++step) {
    const auto g = random_vec(params.size(), 81 + step, 0.01);
    auto d_g = to_device<float>(g);
    cpu.step(params, g, ocfg.lr * (step + 1));
    gpu.step(d_params.span(), d_g.span(), ocfg.lr * (step + 1), s.get());
    s.synchronize("adamw test");
  }
  const auto got = download(d_params.span());
  size_t differing = 0;
  for (size_t i = 0; i < got.size(); ++i)
    differing += std::bit_cast<uint32_t>(got[i]) != std::bit_cast<uint32_t>(params[i]);
  EXPECT_TRUE(record_parity("adamw", Precision::Fp32, "params", compare(got, params)));
  // The kernel rounds every operation (__f*_rn, correctly rounded sqrt and division) and the
  // CPU build does not contract (-ffp-contract=off): the same IEEE operations in the same order.
  RecordProperty("adamw_elements_with_different_bits", std::to_string(differing));
  EXPECT_EQ(differing, 0u) << "of " << got.size() << " elements differ in their bits from the CPU update";
  vector<float> m, v;
  gpu.download(m, v);
  EXPECT_TRUE(record_parity("adamw", Precision::Fp32, "m", compare(m, cpu.m())));
  EXPECT_TRUE(record_parity("adamw", Precision::Fp32, "v", compare(v, cpu.v())));
  EXPECT_EQ(gpu.steps(), 3);
  EXPECT_THROW(gpu.step_shard(d_params.span(), d_params.span(), 1e-3, s.get()), geoloco::Error);
}

// Muon (train.optimizer.kind: muon) on the device: the momentum and every AdamW tensor are the
// CPU optimizer's bits; the matrices' updates (Newton-Schulz through cuBLAS) agree to rounding.
TEST(CudaMuonParity, MatchesTheCpuOptimizer) {
  GEOLOCO_REQUIRE_GPU();
  const auto cfg = small_model();
  const trainer::ParamLayout layout(cfg);
  trainer::OptimizerConfig ocfg;
  ocfg.kind = trainer::OptimizerKind::Muon;
  ocfg.lr = 3e-3;
  ocfg.weight_decay = 0.1;
  const int64_t n = layout.total();
  trainer::InnerOptimizer cpu(ocfg, layout, 0, n);
  CudaInnerOptimizer gpu(ocfg, layout, 0, n);
  const auto start = random_vec(size_t(n), 90, 0.05);
  auto params = start;
  auto d_params = to_device<float>(params);
  Stream s;
  for (int step = 0; step < 3; ++step) {
    const auto g = random_vec(params.size(), 91 + step, 0.01);
    auto d_g = to_device<float>(g);
    cpu.step(params, g, ocfg.lr * (step + 1));
    gpu.step(d_params.span(), d_g.span(), ocfg.lr * (step + 1), s.get());
    s.synchronize("muon test");
  }
  const auto got = download(d_params.span());
  vector<bool> in_matrix(size_t(n), false);
  for (const auto& mm : trainer::muon_matrices(layout))
    std::fill(in_matrix.begin() + mm.offset, in_matrix.begin() + mm.end(), true);
  vector<float> gpu_delta, cpu_delta;
  size_t adamw_differ = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (in_matrix[i]) {
      gpu_delta.push_back(got[i] - start[i]);
      cpu_delta.push_back(params[i] - start[i]);
    } else {
      adamw_differ += std::bit_cast<uint32_t>(got[i]) != std::bit_cast<uint32_t>(params[i]);
    }
  }
  EXPECT_EQ(adamw_differ, 0u) << "AdamW elements differ from the CPU's bits";
  const ErrorStats es = compare(gpu_delta, cpu_delta);
  EXPECT_TRUE(record_parity("muon", Precision::Fp32, "matrix updates", es)) << "rel_l2 " << es.rel_l2;
  double moved = 0;
  for (float d : cpu_delta) moved = std::max(moved, double(std::fabs(d)));
  EXPECT_GT(moved, 1e-4) << "the matrices did not move";
  vector<float> m, v;
  gpu.download(m, v);
  size_t m_differ = 0;
  for (size_t i = 0; i < m.size(); ++i)
    m_differ += std::bit_cast<uint32_t>(m[i]) != std::bit_cast<uint32_t>(cpu.m()[i]);
  EXPECT_EQ(m_differ, 0u) << "momentum bits differ from the CPU's";
  EXPECT_GT(gpu.scratch_bytes(), 0u);
  // A range that cuts a matrix needs the site's gather.
  CudaInnerOptimizer cut(ocfg, layout, layout.block(0).attn_w + 5, n);
  EXPECT_TRUE(cut.needs_gather());
  EXPECT_THROW(cut.step(d_params.span(), d_params.span(), 1e-3, s.get()), geoloco::Error);
}

TEST(Staging, DownloadAndUploadOnTheCopyStream) {
  GEOLOCO_REQUIRE_GPU();
  const size_t n = (size_t(1) << 22) + 3;
  const auto src = random_vec(n, 90);
  auto d_src = to_device<float>(src);
  Stream compute;
  HostStager st(n);
  // Work on the compute stream first: the copy must see its result (ordering by event).
  check_cuda(cudaMemsetAsync(d_src.data(), 0, 64 * sizeof(float), compute.get()), "test memset");
  st.download_async(d_src.span(), compute.get());
  const auto host = st.wait();
  ASSERT_EQ(host.size(), n);
  vector<float> want = src;
  std::fill(want.begin(), want.begin() + 64, 0.0f);
  EXPECT_TRUE(std::equal(host.begin(), host.end(), want.begin()));
  EXPECT_TRUE(st.ready());
  EXPECT_TRUE(
      record_parity("staging", Precision::Fp32, "download", compare(vector<float>(host.begin(), host.end()), want)));

  const auto up = random_vec(1000, 91);
  DeviceBuffer<float> dst(1000);
  st.upload_async(up, dst.span(), compute.get());
  compute.synchronize("test");
  EXPECT_EQ(download(dst.span()), up);
  EXPECT_THROW(st.download_async(DeviceBuffer<float>(n + 1).span(), compute.get()), geoloco::Error);
}

// A one-rank "device collective" that records what it was asked to reduce and a host copy
// of the data at that moment (to prove the reduction saw final gradients).
class RecordingCollective final : public parallel::Collective {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::string& site() const override { return site_; }
  const char* backend() const override { return "recording"; }
  parallel::MemorySpace memory() const override { return parallel::MemorySpace::kCuda; }
  void all_reduce_sum(std::span<float> data) override {
    calls.emplace_back(data.data(), data.size());
    snapshots.push_back(download(data));
  }
  void all_reduce_sum(std::span<double>) override { unused(); }
  void all_reduce_sum(std::span<uint64_t>) override { unused(); }
  void reduce_scatter_sum(std::span<const float>, std::span<float>) override { unused(); }
  void all_gather(std::span<const float>, std::span<float>) override { unused(); }
  void broadcast(std::span<float>, int) override { unused(); }
  void barrier() override { unused(); }
  std::vector<std::vector<std::byte>> all_gather_bytes(std::span<const std::byte>) override {
    unused();
    return {};
  }
  std::vector<std::pair<float*, size_t>> calls;
  std::vector<std::vector<float>> snapshots;

 private:
  [[noreturn]] static void unused() { throw geoloco::Error("RecordingCollective: unexpected call"); }
  std::string site_ = "test";
};

TEST(GradOverlap, ReducesEachBlockOnceInOrderAfterItIsFinal) {
  GEOLOCO_REQUIRE_GPU();
  const auto cfg = small_model();
  const int B = 4, T = 48;
  CudaGpt gpu(cfg, Precision::Fp32);
  const auto& layout = gpu.layout();
  vector<float> params(size_t(layout.total()));
  trainer::Gpt::init_params(layout, params, 21);
  auto d_params = to_device<float>(params);
  DeviceBuffer<float> d_grads(params.size());
  check_cuda(cudaMemset(d_grads.data(), 0, d_grads.size() * 4), "zero grads");
  check_cuda(cudaDeviceSynchronize(), "zero grads");
  const auto x = tokens(B * T, 22, cfg.vocab_size), y = tokens(B * T, 23, cfg.vocab_size);
  RecordingCollective coll;
  OverlappedAllReduce overlap(coll, layout, d_grads.span());
  gpu.forward(d_params.span(), x.data(), y.data(), B, T);
  gpu.backward(d_params.span(), d_grads.span(), 1.0f, overlap.hook());
  overlap.wait();
  const auto final_grads = download(d_grads.span());
  // Calls: block 1, block 0, then [0, block 0 begin) and [block 1 end, total).
  std::vector<std::pair<int64_t, int64_t>> want;
  for (int b : {1, 0, -1})
    for (auto r : OverlappedAllReduce::ranges_for(layout, b)) want.push_back(r);
  ASSERT_EQ(coll.calls.size(), want.size());
  int64_t covered = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(coll.calls[i].first, d_grads.data() + want[i].first) << i;
    EXPECT_EQ(int64_t(coll.calls[i].second), want[i].second - want[i].first) << i;
    covered += want[i].second - want[i].first;
    // What the collective saw is what the gradient finally is: it ran after the block was done.
    const vector<float> fin(final_grads.begin() + want[i].first, final_grads.begin() + want[i].second);
    EXPECT_EQ(coll.snapshots[i], fin) << "range " << i << " was read before its gradient was final";
  }
  EXPECT_EQ(covered, layout.total());
}

}  // namespace
}  // namespace geoloco::cuda::testing

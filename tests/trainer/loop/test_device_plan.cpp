// Host-side pieces of the GPU path that run everywhere: device buffer sizing per strategy,
// the local-rank -> GPU mapping, the CPU strategy's optimizer-state round trip (the interface
// checkpoints use on both paths), and the config checks for site.device / train.precision.
#include <gtest/gtest.h>

#include <numeric>

#include "test_util.hpp"
#include "core/error.hpp"
#include "trainer/loop/device_plan.hpp"
#include "trainer/loop/device_site.hpp"
#include "trainer/loop/run_config.hpp"
#include "trainer/model/gpt.hpp"

using namespace geoloco;
using namespace geoloco::trainer;
using geoloco::test::TempDir;
using geoloco::testing::tiny_config;

TEST(DevicePlan, SizesPerStrategy) {
  const int64_t n = 1001;  // uneven over 3 ranks: shards 334, 334, 333
  for (int r = 0; r < 3; ++r) {
    const auto sh = geoloco::shard_of(n, r, 3);
    auto ddp = plan_device_buffers(StrategyKind::Ddp, n, r, 3);
    EXPECT_EQ(ddp.param_elems, n);
    EXPECT_EQ(ddp.grad_elems, n);
    EXPECT_TRUE(ddp.grads_persistent);
    EXPECT_EQ(ddp.grad_shard_elems, 0);
    EXPECT_EQ(ddp.opt_begin, 0);
    EXPECT_EQ(ddp.opt_end, n);
    EXPECT_EQ(ddp.mirror_elems, sh.count);
    EXPECT_TRUE(ddp.overlap);

    auto z1 = plan_device_buffers(StrategyKind::Zero1, n, r, 3);
    EXPECT_EQ(z1.param_elems, n);
    EXPECT_EQ(z1.opt_begin, sh.offset);
    EXPECT_EQ(z1.opt_end, sh.end());
    EXPECT_TRUE(z1.overlap);

    auto z2 = plan_device_buffers(StrategyKind::Zero2, n, r, 3);
    EXPECT_EQ(z2.param_elems, n);
    EXPECT_FALSE(z2.grads_persistent);
    EXPECT_EQ(z2.grad_shard_elems, sh.count);
    EXPECT_EQ(z2.gathered_elems, 0);
    EXPECT_FALSE(z2.overlap);  // shards do not align with blocks

    auto fs = plan_device_buffers(StrategyKind::Fsdp, n, r, 3);
    EXPECT_EQ(fs.param_elems, sh.count);
    EXPECT_EQ(fs.gathered_elems, n);
    EXPECT_EQ(fs.opt_elems(), sh.count);
    EXPECT_FALSE(fs.overlap);
    // Persistent memory falls ddp > zero1 > zero2 > fsdp; fsdp's peak holds full params + grads.
    EXPECT_GT(ddp.persistent_device_bytes(), z1.persistent_device_bytes());
    EXPECT_GT(z1.persistent_device_bytes(), z2.persistent_device_bytes());
    EXPECT_GT(z2.persistent_device_bytes(), fs.persistent_device_bytes());
    EXPECT_EQ(fs.peak_device_bytes(), uint64_t(sh.count + n + sh.count + n + 2 * sh.count) * 4);
    auto j = fs.to_json();
    EXPECT_EQ(j["param_bytes"].get<uint64_t>(), uint64_t(sh.count) * 4);
    EXPECT_EQ(j["pinned_mirror_bytes"].get<uint64_t>(), uint64_t(sh.count) * 4);
    EXPECT_EQ(j["peak_transient_bytes"].get<uint64_t>(), uint64_t(2 * n) * 4);
  }
  // One rank: no overlap (no collective), the shard is everything.
  auto one = plan_device_buffers(StrategyKind::Ddp, n, 0, 1);
  EXPECT_FALSE(one.overlap);
  EXPECT_EQ(one.mirror_elems, n);
  EXPECT_THROW(plan_device_buffers(StrategyKind::Ddp, n, 3, 3), Error);
}

// hybrid over 6 ranks as 2 groups of 3: a rank holds its group's share of the parameters (n/3,
// its chunk of every block), gathers n for the step, and keeps the optimizer on its site shard.
TEST(DevicePlan, HybridHoldsItsPiecesAndUpdatesItsShard) {
  const int64_t n = 1001;
  int64_t held_total = 0;
  for (int r = 0; r < 6; ++r) {
    const auto sh = geoloco::shard_of(n, r, 6);
    auto h = plan_device_buffers(StrategyKind::Hybrid, n, r, 6, 3);
    EXPECT_EQ(h.param_elems, geoloco::shard_of(n, r, 6).count + geoloco::shard_of(n, (r + 3) % 6, 6).count);
    if (r < 3) held_total += h.param_elems;
    EXPECT_FALSE(h.grads_persistent);
    EXPECT_EQ(h.grad_shard_elems, sh.count);
    EXPECT_EQ(h.gathered_elems, n);
    EXPECT_EQ(h.opt_begin, sh.offset);
    EXPECT_EQ(h.opt_end, sh.end());
    EXPECT_FALSE(h.overlap);
    EXPECT_EQ(h.peak_device_bytes(), static_cast<uint64_t>(2 * h.param_elems + n + sh.count + n + 2 * sh.count) * 4);
  }
  EXPECT_EQ(held_total, n) << "one group's ranks hold every parameter once";
  EXPECT_THROW(plan_device_buffers(StrategyKind::Hybrid, n, 0, 6, 4), InputError);
}

TEST(DevicePlan, LocalRankCountsEveryRankOnTheSameHost) {
  TempDir d;
  d.file("k.psk", "0123456789abcdef-test-key");
  auto cfg =
      load_run_config(d.file("c.yaml", tiny_config(d.path() / "out", "",
                                                   "sites:\n"
                                                   "  - {name: a, ranks: 2, host: 10.0.0.1, port: 31100}\n"
                                                   "  - {name: b, ranks: 2, host: 10.0.0.1, port: 31110}\n"
                                                   "  - {name: c, ranks: 2, hosts: [10.0.0.2, 10.0.0.3], port: 31120}\n"
                                                   "transport: {psk_file: k.psk}\n")));
  auto lr = local_rank_of(cfg, 0, 1);
  EXPECT_EQ(lr.rank, 1);
  EXPECT_EQ(lr.ranks, 4);
  lr = local_rank_of(cfg, 1, 0);  // site b shares the node: GPUs 2 and 3
  EXPECT_EQ(lr.rank, 2);
  EXPECT_EQ(lr.ranks, 4);
  lr = local_rank_of(cfg, 2, 1);  // one rank per node
  EXPECT_EQ(lr.rank, 0);
  EXPECT_EQ(lr.ranks, 1);
}

TEST(DevicePlan, CpuOptimizerStateRoundTrips) {
  ModelConfig mc;
  mc.n_layer = 1;
  mc.n_head = 2;
  mc.n_embd = 16;
  mc.block_size = 8;
  mc.vocab_size = 32;
  ParamLayout layout(mc);
  std::vector<float> init(static_cast<size_t>(layout.total()));
  Gpt::init_params(layout, init, 7);
  SiteStrategy s(StrategyKind::Ddp, layout, nullptr, OptimizerConfig{}, init);
  auto st = s.optimizer_state();
  EXPECT_EQ(st.begin, 0);
  EXPECT_EQ(st.end, layout.total());
  EXPECT_EQ(st.steps, 0);
  std::vector<float> m(st.m.size()), v(st.v.size());
  std::iota(m.begin(), m.end(), 1.0f);
  std::iota(v.begin(), v.end(), 2.0f);
  s.load_optimizer(m, v, 5);
  st = s.optimizer_state();
  EXPECT_EQ(st.steps, 5);
  EXPECT_TRUE(std::equal(m.begin(), m.end(), st.m.begin()));
  EXPECT_TRUE(std::equal(v.begin(), v.end(), st.v.begin()));
  EXPECT_THROW(s.load_optimizer(std::span<const float>(m).first(3), v, 1), Error);
  double sums[2] = {1.5, 2.5};
  s.site_sum(sums);  // one rank: unchanged
  EXPECT_EQ(sums[0], 1.5);
}

TEST(DevicePlan, DeviceAndPrecisionConfig) {
  TempDir d;
  auto bf16_cpu = d.file("a.yaml", tiny_config(d.path() / "out", "  precision: bf16\n"));
  EXPECT_THROW(load_run_config(bf16_cpu), ConfigError);
  auto cuda = d.file("b.yaml", tiny_config(d.path() / "out", "  precision: bf16\n", "site: {device: cuda}\n"));
  if (built_with_cuda()) {
    auto cfg = load_run_config(cuda);
    EXPECT_EQ(cfg.sites[0].device, "cuda");
    EXPECT_EQ(cfg.train.precision, "bf16");
  } else {
    try {
      load_run_config(cuda);
      ADD_FAILURE() << "expected a ConfigError";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("built without CUDA"), std::string::npos) << e.what();
    }
    EXPECT_THROW(select_rank_device(load_run_config(d.file("c.yaml", tiny_config(d.path() / "out"))), 0, 0),
                 ConfigError);
  }
}

// train.attention: fused asked for where it cannot run is an error naming the key and why.
TEST(DevicePlan, FusedAttentionNeedsBf16AndASupportedHeadSize) {
  TempDir d;
  const std::string cuda_site = built_with_cuda() ? "site: {device: cuda}\n" : "";
  auto fp32 = d.file("a.yaml", tiny_config(d.path() / "out", "  attention: fused\n", cuda_site));
  try {
    load_run_config(fp32);
    ADD_FAILURE() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("train.attention: fused: the fused attention runs in bf16 only"),
              std::string::npos)
        << e.what();
  }
  auto bad = d.file("b.yaml", tiny_config(d.path() / "out", "  attention: flash\n"));
  EXPECT_THROW(load_run_config(bad), ConfigError);
  auto plain = load_run_config(d.file("c.yaml", tiny_config(d.path() / "out")));
  EXPECT_EQ(plain.train.attention, "auto");
  if (built_with_cuda()) {
    auto ok = load_run_config(
        d.file("e.yaml", tiny_config(d.path() / "out", "  precision: bf16\n  attention: fused\n", cuda_site)));
    EXPECT_EQ(ok.train.attention, "fused");
  }
}

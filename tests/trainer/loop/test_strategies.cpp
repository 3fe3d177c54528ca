// Site strategies on 1, 2 and 3 ranks (threads over Gloo on loopback).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "test_util.hpp"
#include "tests/support/ports.hpp"
#include "tests/support/threads.hpp"
#include "trainer/loop/run_config.hpp"
#include "trainer/loop/trainer.hpp"
#include "trainer/parallel/gloo_collective.hpp"

using namespace geoloco;
using namespace geoloco::trainer;
using geoloco::test::TempDir;
using geoloco::testing::tiny_config;

namespace {

struct RunResult {
  std::vector<float> params;
  std::vector<nlohmann::json> summaries;
};

// Runs one site of `ranks` ranks (threads) with `strategy`.
RunResult run_site(const std::string& strategy, int ranks, int micro_batch, const std::string& extra_sets = "",
                   const std::string& extra_set2 = "") {
  TempDir d;
  const int port = test::fresh_port();
  std::string yaml =
      tiny_config(d.path() / "out", "",
                  "site: {strategy: " + strategy + "}\nsites: [{name: s, ranks: " + std::to_string(ranks) +
                      ", port: " + std::to_string(port) + "}]\n");
  std::vector<std::string> sets = {"train.micro_batch=" + std::to_string(micro_batch), "train.steps=12"};
  if (!extra_sets.empty()) sets.push_back(extra_sets);
  if (!extra_set2.empty()) sets.push_back(extra_set2);
  auto cfg = load_run_config(d.file("run.yaml", yaml), sets);
  const auto run = geoloco::testing::run_site_threads(cfg, port + ranks);
  RunResult res;
  res.summaries = run.summaries;
  const auto& params = run.params;
  for (int r = 1; r < ranks; ++r) EXPECT_EQ(params[0], params[static_cast<size_t>(r)]) << "rank " << r << " diverged";
  res.params = params[0];
  return res;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, double(std::fabs(a[i] - b[i])));
  return m;
}

}  // namespace

// zero1 only shards the optimizer: the arithmetic is ddp's, bit for bit.
TEST(Strategies, Zero1EqualsDdpBitForBit) {
  auto ddp = run_site("ddp", 2, 4);
  auto z1 = run_site("zero1", 2, 4);
  EXPECT_EQ(ddp.params, z1.params);
}

// zero2/fsdp reduce-scatter instead of all-reduce (same bits per shard, see collective.hpp);
// only the global-norm summation differs, which matters only when clipping is active.
TEST(Strategies, Zero2AndFsdpEqualDdpWithoutClipping) {
  auto ddp = run_site("ddp", 2, 4, "train.grad_clip=0");
  auto z2 = run_site("zero2", 2, 4, "train.grad_clip=0");
  auto fs = run_site("fsdp", 2, 4, "train.grad_clip=0");
  EXPECT_EQ(ddp.params, z2.params);
  EXPECT_EQ(ddp.params, fs.params);
}

// With clipping on, the norm's rounding differs: equal within a float tolerance.
TEST(Strategies, AllStrategiesTrainTheSameModelWithClipping) {
  auto ddp = run_site("ddp", 3, 2, "train.grad_clip=0.5");
  for (const char* s : {"zero1", "zero2", "fsdp"}) {
    auto other = run_site(s, 3, 2, "train.grad_clip=0.5");
    EXPECT_LT(max_abs_diff(ddp.params, other.params), 1e-5) << s;
    EXPECT_NEAR(ddp.summaries[0]["final_loss"].get<double>(), other.summaries[0]["final_loss"].get<double>(), 1e-5)
        << s;
  }
}

// ddp on N ranks sees the same data per step as one rank with N x the micro-batch (the
// sampler's union property); only the gradient summation order differs.
TEST(Strategies, DdpOnNRanksEqualsOneRankWithNTimesTheBatch) {
  auto one = run_site("ddp", 1, 8);
  auto two = run_site("ddp", 2, 4);
  EXPECT_LT(max_abs_diff(one.params, two.params), 1e-4);
  EXPECT_NEAR(one.summaries[0]["final_loss"].get<double>(), two.summaries[0]["final_loss"].get<double>(), 1e-4);
}

// Memory accounting follows the definitions.
TEST(Strategies, MemoryAccounting) {
  auto ddp = run_site("ddp", 2, 4);
  auto fs = run_site("fsdp", 2, 4);
  auto z2 = run_site("zero2", 2, 4);
  const int64_t n = ddp.summaries[0]["params"].get<int64_t>();
  auto& md = ddp.summaries[0]["memory"];
  auto& mf = fs.summaries[0]["memory"];
  auto& mz = z2.summaries[0]["memory"];
  EXPECT_EQ(md["param_bytes"].get<int64_t>(), n * 4);
  EXPECT_EQ(md["optimizer_bytes"].get<int64_t>(), 2 * n * 4);
  EXPECT_EQ(mf["param_bytes"].get<int64_t>(), ((n + 1) / 2) * 4);
  EXPECT_EQ(mf["optimizer_bytes"].get<int64_t>(), 2 * ((n + 1) / 2) * 4);
  EXPECT_EQ(mz["grad_bytes"].get<int64_t>(), 0);
  EXPECT_EQ(mz["grad_shard_bytes"].get<int64_t>(), ((n + 1) / 2) * 4);
  EXPECT_GT(ddp.summaries[0]["site_bytes_per_step"].get<double>(), 0);
}

// Muon (train.optimizer.kind: muon): a sharded site all-gathers the matrices' momentum updates
// (a shard of 3 ranks cuts matrices), so every strategy applies ddp's update bit for bit.
TEST(Strategies, MuonUnderEveryStrategyIsDdpsUpdate) {
  const std::string muon = "train.optimizer.kind=muon";
  auto ddp = run_site("ddp", 3, 2, "train.grad_clip=0", muon);
  for (const char* s : {"zero1", "zero2", "fsdp"}) {
    auto other = run_site(s, 3, 2, "train.grad_clip=0", muon);
    EXPECT_EQ(ddp.params, other.params) << s;
    EXPECT_EQ(other.summaries[1]["memory"]["optimizer"], "muon") << s;
    EXPECT_GT(other.summaries[1]["memory"]["optimizer_scratch_bytes"].get<int64_t>(), 0) << s;
  }
  auto adamw = run_site("ddp", 3, 2, "train.grad_clip=0");
  EXPECT_GT(max_abs_diff(ddp.params, adamw.params), 1e-3) << "Muon's run should not be AdamW's";
  // The gather is only the matrices the shards cut, each part broadcast from its rank: exactly
  // that many bytes per step, far below an all-gather of the whole update buffer.
  auto z2 = run_site("zero2", 3, 2, "train.grad_clip=0", muon);
  const int64_t n = z2.summaries[0]["params"].get<int64_t>();
  const std::vector<int64_t> bounds = {0, geoloco::shard_of(n, 1, 3).offset, geoloco::shard_of(n, 2, 3).offset, n};
  OptimizerConfig oc;
  oc.kind = OptimizerKind::Muon;
  const auto parts = muon_cut_parts(oc, ParamLayout(ModelConfig{2, 2, 32, 16, 32}), bounds);
  ASSERT_FALSE(parts.empty()) << "3 shards of this model cut matrices";
  int64_t expected = 0;
  for (const auto& p : parts) expected += p.count * 4 * 2;  // the root sends its part to 2 ranks
  int64_t sent = 0;
  for (const auto& r : z2.summaries) sent += r["site_collectives"]["broadcast"]["bytes_sent"].get<int64_t>();
  EXPECT_EQ(sent, expected * 12) << "12 steps";
  EXPECT_LT(expected, 2 * n * 4 / 2) << "vs the all-gather of the update buffer: 2 n floats over 3 ranks";
  EXPECT_LT(ddp.summaries[0]["final_loss"].get<double>(), 3.3) << "it trains (the loss starts near ln 32 = 3.47)";
}

// hybrid (docs/strategies.md): with one group of every rank it is fsdp, with groups of one rank
// zero2 -- the same collectives on the same buffers, so bit for bit; with groups in between it
// is ddp up to the order of the gradient's float sums (inside a group, then over the groups).
// Every rank ends with the same parameters (run_site checks it).
TEST(Strategies, HybridIsFsdpAndZero2AtItsEndsAndDdpBetween) {
  const std::string clip = "train.grad_clip=0.5";
  auto fs = run_site("fsdp", 4, 2, clip);
  auto one_group = run_site("hybrid, group_size: 4", 4, 2, clip);
  EXPECT_EQ(fs.params, one_group.params);
  auto z2 = run_site("zero2", 4, 2, clip);
  auto singles = run_site("hybrid, group_size: 1", 4, 2, clip);
  EXPECT_EQ(z2.params, singles.params);
  auto ddp = run_site("ddp", 4, 2, clip);
  auto pairs = run_site("hybrid, group_size: 2", 4, 2, clip);
  EXPECT_LT(max_abs_diff(ddp.params, pairs.params), 1e-5);
  EXPECT_NEAR(ddp.summaries[0]["final_loss"].get<double>(), pairs.summaries[3]["final_loss"].get<double>(), 1e-5);
  // Traffic per rank and step (n floats): fsdp's all-gather and reduce-scatter over the 4-rank
  // ring send 2 x 3/4 n; hybrid's replica set (2 ranks) reduce-scatters and all-gathers the n/2
  // held elements: 2 x 1/4 n leave the pair (a third of what an fsdp rank sends), the rest stays
  // inside it.
  const auto& hs = pairs.summaries[0];
  const double fsdp_bytes = fs.summaries[0]["site_bytes_per_step"].get<double>();
  const double across = hs["cross_group_bytes_per_step"].get<double>();
  EXPECT_GT(across, 0.30 * fsdp_bytes);
  EXPECT_LT(across, 0.36 * fsdp_bytes);
  EXPECT_NEAR(hs["group_bytes_per_step"].get<double>() + across, hs["site_bytes_per_step"].get<double>(), 1e-6);
  // Memory: a pair holds half the parameters; the optimizer state is the rank's quarter.
  const int64_t n = ddp.summaries[0]["params"].get<int64_t>();
  for (int r = 0; r < 4; ++r) {
    const auto& m = pairs.summaries[size_t(r)]["memory"];
    EXPECT_EQ(m["strategy"], "hybrid");
    EXPECT_EQ(m["group_size"], 2);
    EXPECT_EQ(m["groups"], 2);
    const int64_t quarter = n / 4 + (r < n % 4 ? 1 : 0);
    EXPECT_EQ(m["optimizer_bytes"].get<int64_t>(), 2 * quarter * 4) << r;
    EXPECT_NEAR(m["param_bytes"].get<double>(), n / 2.0 * 4, 8) << r;
  }
}

// Six ranks as two groups of three and as three pairs, under Muon (whose sharded step gathers
// the matrices through both subgroups): ddp's model within float tolerance.
TEST(Strategies, HybridOnSixRanksUnderMuonTracksDdp) {
  const std::string muon = "train.optimizer.kind=muon";
  auto ddp = run_site("ddp", 6, 1, "train.grad_clip=0", muon);
  for (const char* g : {"3", "2"}) {
    auto h = run_site(std::string("hybrid, group_size: ") + g, 6, 1, "train.grad_clip=0", muon);
    EXPECT_LT(max_abs_diff(ddp.params, h.params), 1e-5) << g;
    EXPECT_EQ(h.summaries[5]["memory"]["group_size"].get<int>(), std::stoi(g));
  }
}

// A hybrid site stopped and resumed from its checkpoint (each rank's site shard and optimizer
// range, as zero2/fsdp write them) ends bit for bit where the uninterrupted run ends.
TEST(Strategies, HybridResumeIsBitExact) {
  auto run = [](const std::filesystem::path& dir, int port, int64_t stop_at, bool resume) {
    const std::string yaml = tiny_config(
        dir / "out", "",
        "site: {strategy: hybrid, group_size: 2}\nsites: [{name: s, ranks: 4, port: " + std::to_string(port) + "}]\n");
    std::ofstream(dir / "run.yaml") << yaml;
    auto cfg = load_run_config((dir / "run.yaml").string(), {"train.steps=12"});
    const auto params = geoloco::testing::run_site_threads(cfg, port + 4, [&](TrainerOptions& o) {
                          o.stop_at_step = stop_at;
                          o.resume = resume;
                        }).params;
    for (int r = 1; r < 4; ++r) EXPECT_EQ(params[0], params[size_t(r)]);
    return params[0];
  };
  TempDir a, b;
  const auto whole = run(a.path(), test::fresh_port(), 0, false);
  const int port = test::fresh_port();
  run(b.path(), port, 7, false);
  const auto resumed = run(b.path(), port, 0, true);
  EXPECT_EQ(whole, resumed);
}

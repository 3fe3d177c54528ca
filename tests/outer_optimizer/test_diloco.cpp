// The DiLoCo outer loop end to end, ranks as threads in this process (UCX over loopback
// between sites, Gloo inside a site).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <thread>
#include <tuple>

#include "tests/trainer/loop/test_util.hpp"
#include "tests/support/ports.hpp"
#include "multisite_util.hpp"
#include "trainer/app/rank_runner.hpp"
#include "trainer/checkpoint/model_checkpoint.hpp"
#include "core/hash.hpp"
#include "trainer/loop/run_config.hpp"
#include "trainer/loop/trainer.hpp"

using namespace geoloco;
using geoloco::test::fresh_port;
using geoloco::test::TempDir;
using geoloco::testing::load_params;

namespace {

std::string base(const std::filesystem::path& out, int steps) {
  return "run: {name: d, seed: 3, output_dir: " + out.string() +
         "}\n"
         "model: {n_layer: 2, n_head: 2, n_embd: 32, block_size: 16, vocab_size: 32}\n"
         "data:\n  train: {kind: synthetic, vocab: 32, branching: 3, seed: 5, tokens: 400000}\n"
         "train: {steps: " +
         std::to_string(steps) + ", micro_batch: 4, log_every: 5, optimizer: {lr: 3.0e-3}}\n";
}

std::string sites(int count, int ranks) { return geoloco::testing::sites_yaml(count, ranks, fresh_port()); }

struct RunOut {
  std::vector<nlohmann::json> summaries;  // by global rank
};

RunOut run_all(const trainer::RunConfig& cfg) { return {geoloco::testing::run_ranks(cfg)}; }

std::string psk(const TempDir& d) { return d.file("k.psk", "0123456789abcdef-test-key"); }

}  // namespace

// One site, H = 1, outer SGD with lr 1 and no momentum: global <- global - (global - local)
// = local after every step, i.e. plain training up to float rounding of g - (g - l).
TEST(Diloco, OneSiteH1SgdLr1EqualsPlainTraining) {
  TempDir a, b;
  auto plain = trainer::load_run_config(a.file("c.yaml", base(a.path() / "out", 20)));
  auto outer = trainer::load_run_config(
      b.file("c.yaml",
             base(b.path() / "out", 20) +
                 "outer: {interval: 1, optimizer: {kind: sgd, lr: 1.0, momentum: 0.0}, compression: {codec: fp32}}\n"));
  auto pa = run_all(plain).summaries[0];
  auto pb = run_all(outer).summaries[0];
  EXPECT_EQ(pb["outer_steps"].get<int>(), 20);
  auto wa = load_params(pa["checkpoint"]), wb = load_params(pb["checkpoint"]);
  double max_diff = 0;
  for (size_t i = 0; i < wa.size(); ++i) max_diff = std::max(max_diff, double(std::fabs(wa[i] - wb[i])));
  // float rounding of g - (g - l) compounds through AdamW: a loose, stated tolerance.
  EXPECT_LT(max_diff, 1e-4);
  EXPECT_NEAR(pa["val_loss"].get<double>(), pb["val_loss"].get<double>(), 1e-4);
}

// N sites replaying identical data compute identical pseudo-gradients, so their average is
// one site's pseudo-gradient: with 2 sites exactly (0.5 d + 0.5 d = d in floating point), so
// the run equals the one-site DiLoCo run bit for bit; with 3 sites the weight 1/3 is not a
// float and the average rounds, so the runs agree within float tolerance.
TEST(Diloco, NSitesOnIdenticalDataEqualOneSite) {
  const std::string outer = "outer: {interval: 4, compression: {codec: fp32}}\n";
  TempDir a;
  auto one =
      trainer::load_run_config(a.file("c.yaml", base(a.path() / "out", 16) + outer), {"data.across_sites=identical"});
  auto s1 = run_all(one).summaries[0];
  EXPECT_EQ(s1["outer_steps"].get<int>(), 4);
  for (int n : {2, 3}) {
    TempDir b;
    psk(b);
    auto many = trainer::load_run_config(b.file("c.yaml", base(b.path() / "out", 16) + outer + sites(n, 1) +
                                                              "transport: {psk_file: k.psk, timeout_s: 30}\n"),
                                         {"data.across_sites=identical"});
    auto sn = run_all(many).summaries;
    for (auto& s : sn) {
      if (n == 2) {
        EXPECT_EQ(s["global_weights_hash"], s1["global_weights_hash"]);
        EXPECT_EQ(s["params_hash"], s1["params_hash"]);
      } else {
        EXPECT_NEAR(s["val_loss"].get<double>(), s1["val_loss"].get<double>(), 1e-4);
      }
    }
  }
}

// Many outer steps with a lossy codec and error feedback: every site ends every outer step
// with the same global weights (the run checks it each sync and would stop), and ends with
// identical parameters.
TEST(Diloco, CrossSiteBitIdentityOverManyOuterSteps) {
  TempDir d;
  psk(d);
  auto cfg = trainer::load_run_config(
      d.file("c.yaml",
             base(d.path() / "out", 24) +
                 "outer: {interval: 3, compression: {codec: int4, block: 64, error_feedback: true, zstd_level: 1}}\n" +
                 sites(2, 2) + "transport: {psk_file: k.psk, timeout_s: 30}\n"));
  auto out = run_all(cfg);
  ASSERT_EQ(out.summaries.size(), 4u);
  auto& s0 = out.summaries[0];
  EXPECT_EQ(s0["outer_steps"].get<int>(), 8);
  EXPECT_EQ(s0["world_size"].get<int>(), 4);
  ASSERT_EQ(s0["ranks"].size(), 4u);
  std::set<std::string> hashes, params;
  for (auto& r : s0["ranks"]) {
    hashes.insert(r["global_weights_hash"].get<std::string>());
    params.insert(r["params_hash"].get<std::string>());
  }
  EXPECT_EQ(hashes.size(), 1u);
  EXPECT_EQ(params.size(), 1u);
  // WAN accounting: every rank sent 8 frames to one peer, and the totals add up.
  uint64_t sent = 0;
  for (auto& r : s0["ranks"]) sent += r["wan_bytes_sent"].get<uint64_t>();
  EXPECT_EQ(s0["wan_bytes_sent_total"].get<uint64_t>(), sent);
  EXPECT_GT(s0["ddp_equivalent_wan_bytes"].get<uint64_t>(), 8 * sent);
  EXPECT_GT(s0["compression_ratio"].get<double>(), 6.0);
  // The outer loop's own memory (nesterov + error feedback): global weights, momentum and the
  // residual kept, 3 x 4 bytes per parameter of the shard, and the round's three buffers (the
  // snapshot becomes the pseudo-gradient in place; a decoded frame; the average).
  for (auto& r : s0["ranks"]) {
    const auto& m = r["outer_memory"];
    const uint64_t n = m["shard_elements"].get<uint64_t>();
    ASSERT_GT(n, 0u);
    EXPECT_EQ(m["global_bytes"].get<uint64_t>(), 4 * n);
    EXPECT_EQ(m["optimizer_bytes"].get<uint64_t>(), 4 * n);
    EXPECT_EQ(m["error_feedback_bytes"].get<uint64_t>(), 4 * n);
    EXPECT_EQ(m["round_buffer_bytes"].get<uint64_t>(), 12 * n);
    EXPECT_DOUBLE_EQ(m["kept_bytes_per_param"].get<double>(), 12.0);
    EXPECT_DOUBLE_EQ(m["bytes_per_param"].get<double>(), 24.0);
  }
  // The summary file on disk is the one returned.
  auto disk = nlohmann::json::parse(std::ifstream(d.path() / "out" / "summary.json"));
  EXPECT_EQ(disk["global_weights_hash"], s0["global_weights_hash"]);
}

// SparseLoCo (outer.optimizer.kind: sparseloco): 2-bit top-k pseudo-gradients with decayed
// error feedback and a plain outer step; the sites end bit-identical, sending a fraction of
// what fp32 would.
TEST(Diloco, SparseLoCoRunsAcrossSitesBitIdentical) {
  TempDir d;
  psk(d);
  auto cfg = trainer::load_run_config(
      d.file("c.yaml", base(d.path() / "out", 12) +
                           "outer: {interval: 3, optimizer: {kind: sparseloco, ef_decay: 0.9}, "
                           "compression: {codec: int2, block: 64, topk: 0.05}}\n" +
                           sites(2, 1) + "transport: {psk_file: k.psk, timeout_s: 30}\n"));
  auto out = run_all(cfg);
  std::set<std::string> params;
  for (auto& r : out.summaries[0]["ranks"]) params.insert(r["params_hash"].get<std::string>());
  EXPECT_EQ(params.size(), 1u);
  EXPECT_EQ(out.summaries[0]["outer_steps"].get<int>(), 4);
  // 4 of 64 per block at 2 bits with their indices and a scale: about 32x fewer bytes than fp32.
  EXPECT_GT(out.summaries[0]["compression_ratio"].get<double>(), 25.0);
  EXPECT_NE(out.summaries[0]["ranks"][0]["compression"].get<std::string>().find("/ef0.9"), std::string::npos)
      << out.summaries[0]["ranks"][0]["compression"];
}

// Every strategy syncs its shard: fsdp and zero2 runs stay bit-identical across sites too.
TEST(Diloco, ShardedStrategiesSyncAcrossSites) {
  for (const char* strategy : {"zero2", "fsdp"}) {
    TempDir d;
    psk(d);
    auto cfg =
        trainer::load_run_config(d.file("c.yaml", base(d.path() / "out", 8) + "site: {strategy: " + strategy + "}\n" +
                                                      "outer: {interval: 4, compression: {codec: int8}}\n" +
                                                      sites(2, 2) + "transport: {psk_file: k.psk, timeout_s: 30}\n"));
    auto out = run_all(cfg);
    std::set<std::string> params;
    for (auto& r : out.summaries[0]["ranks"]) params.insert(r["params_hash"].get<std::string>());
    EXPECT_EQ(params.size(), 1u) << strategy;
  }
}

// Resume in a multi-site run: stop everyone at step 6 (mid-period), resume, finish --
// bit-identical to the uninterrupted run (outer state, error feedback and all).
TEST(Diloco, MultiSiteResumeIsExact) {
  TempDir a, b;
  psk(a);
  psk(b);
  const std::string body = "outer: {interval: 4, compression: {codec: int8, error_feedback: true}}\n";
  auto whole = trainer::load_run_config(a.file(
      "c.yaml", base(a.path() / "out", 12) + body + sites(2, 1) + "transport: {psk_file: k.psk, timeout_s: 30}\n"));
  auto ref = run_all(whole).summaries[0];
  const std::string yaml =
      base(b.path() / "out", 12) + body + sites(2, 1) + "transport: {psk_file: k.psk, timeout_s: 30}\n";
  auto cfg = trainer::load_run_config(b.file("c.yaml", yaml));
  geoloco::testing::run_ranks(cfg, /*stop_at=*/6);
  auto res = geoloco::testing::run_ranks(cfg, 0, /*resume=*/true);
  EXPECT_EQ(res[0]["global_weights_hash"], ref["global_weights_hash"]);
  EXPECT_EQ(res[0]["params_hash"], ref["params_hash"]);
}

// The cross-site weights-hash check (outer.check_hash) runs off the sync path: a round's
// check is verified at the fragment's next round (or a checkpoint, a re-plan, the end).
// Nudging one global weight at one site after round 2 (test hook) must still stop every
// site, naming round 2 and both sites: in the blocking loop (caught at round 3), with
// overlap (on the fragment worker), and when round 2 is the last (caught by the final check).
TEST(Diloco, DivergedSitesStopNamingTheRound) {
  geoloco::testing::RankSetup perturb;
  perturb.hooks.perturb_global = outer::OuterHooks::Perturb{1, 2};
  for (const auto& [what, outer, steps] :
       std::vector<std::tuple<std::string, std::string, int>>{{"blocking", "interval: 4", 16},
                                                              {"overlap", "interval: 4, overlap_steps: 2", 16},
                                                              {"last round", "interval: 4", 8}}) {
    TempDir d;
    psk(d);
    auto cfg =
        trainer::load_run_config(d.file("c.yaml", base(d.path() / "out", steps) + "outer: {" + outer + "}\n" +
                                                      sites(2, 1) + "transport: {psk_file: k.psk, timeout_s: 30}\n"));
    try {
      geoloco::testing::run_ranks(cfg, 0, false, perturb);
      ADD_FAILURE() << what << ": the run did not stop";
    } catch (const std::exception& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("outer round 2: global weights diverged"), std::string::npos) << what << ": " << m;
      EXPECT_NE(m.find("paris"), std::string::npos) << what << ": " << m;
      EXPECT_NE(m.find("lyon"), std::string::npos) << what << ": " << m;
    }
  }
  // Without the hook the same runs finish with one global hash everywhere.
  TempDir d;
  psk(d);
  auto cfg =
      trainer::load_run_config(d.file("c.yaml", base(d.path() / "out", 8) + "outer: {interval: 4}\n" + sites(2, 1) +
                                                    "transport: {psk_file: k.psk, timeout_s: 30}\n"));
  auto out = run_all(cfg);
  EXPECT_EQ(out.summaries[0]["outer_steps"].get<int>(), 2);
}

// Warm start (train.init_from): every site starts from the file's weights, and the run's
// first outer step starts from them too. Sites whose files differ (the same path on other
// machines) are stopped before any training, naming both sites and the file.
TEST(Diloco, WarmStartFromOneFileAndDifferentFilesAreCaughtAtTheStart) {
  TempDir d;
  psk(d);
  // A warm-up run on one site; its checkpoint is what both sites start from.
  auto warm = trainer::load_run_config(d.file("warm.yaml", base(d.path() / "warm", 30)));
  geoloco::testing::run_ranks(warm);
  const std::string site_dir = (d.path() / "warm" / "checkpoints" / "local").string();
  const std::string ckpt = trainer::find_model_file(site_dir);
  const auto warm_params = load_params(ckpt);

  auto cfg =
      trainer::load_run_config(d.file("c.yaml", base(d.path() / "out", 4) + "outer: {interval: 8}\n" + sites(2, 1) +
                                                    "transport: {psk_file: k.psk, timeout_s: 30}\n"),
                               {"train.init_from=" + site_dir});
  EXPECT_EQ(cfg.train.init_from, ckpt);
  // 4 steps, H 8: the only sync is the final one; its global weights start at the file's.
  auto out = run_all(cfg);
  EXPECT_EQ(out.summaries[0]["init_from"].get<std::string>(), ckpt);
  EXPECT_EQ(out.summaries[0]["outer_steps"].get<int>(), 1);
  // Fresh runs start near ln(32) = 3.47; the warm run's first loss is far below.
  auto fresh = run_all(
      trainer::load_run_config(d.file("f.yaml", base(d.path() / "fresh", 4) + "outer: {interval: 8}\n" + sites(2, 1) +
                                                    "transport: {psk_file: k.psk, timeout_s: 30}\n")));
  EXPECT_LT(out.summaries[0]["final_loss"].get<double>(), fresh.summaries[0]["final_loss"].get<double>() - 0.2);

  // Same config (same hash), but site lyon's machine holds another file at that path.
  std::filesystem::create_directories(d.path() / "other");
  auto other = warm_params;
  other[7] += 1.0f;
  trainer::save_model((d.path() / "other" / "model.safetensors").string(), trainer::ParamLayout(cfg.model), other);
  auto cfg2 =
      trainer::load_run_config(d.file("c2.yaml", base(d.path() / "out2", 4) + "outer: {interval: 8}\n" + sites(2, 1) +
                                                     "transport: {psk_file: k.psk, timeout_s: 30}\n"),
                               {"train.init_from=" + site_dir});
  std::vector<trainer::RunConfig> per_site(2, cfg2);
  per_site[1].train.init_from = (d.path() / "other" / "model.safetensors").string();
  try {
    geoloco::testing::run_ranks(per_site);
    ADD_FAILURE() << "sites with different initial weights trained";
  } catch (const std::exception& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("initial weights differ between sites"), std::string::npos) << m;
    EXPECT_NE(m.find("(site paris)"), std::string::npos) << m;
    EXPECT_NE(m.find("at site lyon"), std::string::npos) << m;
    EXPECT_NE(m.find("same file contents (" + ckpt + " here)"), std::string::npos) << m;
  }
}

// Rehearsal (train.rehearsal, trainer/loop/rehearsal.hpp): the real outer loop behind a stand-in
// inner loop. Two sites of two fsdp ranks: every rank ends on one global hash, the steps take
// their configured time, and the pseudo-gradients the outer loop exchanges are the drift's:
// interval x drift x a heavy-tailed direction, different per site.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <set>

#include "multisite_util.hpp"
#include "tests/support/ports.hpp"
#include "tests/support/temp_dir.hpp"
#include "core/safetensors.hpp"
#include "core/error.hpp"
#include "trainer/loop/device_site.hpp"

using namespace geoloco;
using geoloco::test::TempDir;

namespace {

std::string rehearsal_config(const std::filesystem::path& out, const std::string& rehearsal) {
  return "run: {name: r, seed: 3, output_dir: " + out.string() +
         "}\n"
         "model: {n_layer: 2, n_head: 2, n_embd: 32, block_size: 16, vocab_size: 32}\n"
         "data:\n  train: {kind: synthetic, vocab: 32, tokens: 100000}\n"
         "train: {steps: 20, log_every: 5, rehearsal: " +
         rehearsal +
         "}\n"
         "site: {strategy: fsdp}\n"
         "outer: {interval: 5, compression: {codec: int8, block: 256, error_feedback: true}}\n" +
         geoloco::testing::sites_yaml(2, 2, test::fresh_port()) + "transport: {psk_file: k.psk, timeout_s: 30}\n";
}

std::vector<float> delta(const std::filesystem::path& dir, const std::string& site, int rank, int round) {
  const auto f = geoloco::SafetensorsFile::read(
      (dir / ("pseudograd." + site + ".r" + std::to_string(rank) + ".round" + std::to_string(round) + ".safetensors"))
          .string());
  const auto& t = f.tensors().at(0);
  std::vector<float> v(static_cast<size_t>(t.shape.at(0)));
  f.copy_f32("delta", t.shape, v);
  return v;
}

}  // namespace

TEST(Rehearsal, TheOuterLoopRunsBehindAStandInInnerLoop) {
  TempDir d;
  d.file("k.psk", "0123456789abcdef-test-key");
  const auto cfg = trainer::load_run_config(
      d.file("c.yaml", rehearsal_config(d.path() / "out", "{step_seconds: 0.01, drift: 1.0e-3}")));
  geoloco::testing::RankSetup setup;
  setup.hooks.capture_dir = (d.path() / "captured").string();
  std::filesystem::create_directories(setup.hooks.capture_dir);
  const auto out = geoloco::testing::run_ranks(cfg, 0, false, setup);
  ASSERT_EQ(out.size(), 4u);
  std::set<std::string> global, params;
  for (const auto& s : out) {
    global.insert(s["global_weights_hash"].get<std::string>());
    params.insert(s["params_hash"].get<std::string>());
    EXPECT_EQ(s["outer_steps"].get<int>(), 4);
    const auto& r = s["rehearsal"];
    EXPECT_EQ(r["steps"].get<int>(), 20);
    EXPECT_DOUBLE_EQ(r["step_seconds"].get<double>(), 0.01);
    EXPECT_EQ(s["memory"]["optimizer_bytes"].get<int64_t>(), 0) << "a rehearsal keeps no inner optimizer state";
    EXPECT_GE(s["compute_s"].get<double>(), 20 * 0.01);  // every step took its time
    EXPECT_GT(r["measured"]["compute_utilization"].get<double>(), 0.0);
    EXPECT_LE(r["measured"]["compute_utilization"].get<double>(), 1.0);
    EXPECT_TRUE(s["val_loss"].is_null() || std::isnan(s["val_loss"].get<double>())) << "a rehearsal evaluated a model";
  }
  EXPECT_EQ(global.size(), 1u);
  EXPECT_EQ(params.size(), 1u);
  // Round 2's pseudo-gradient of paris rank 0: 5 steps x 1e-3 x a Student-t (nu 3) direction
  // scaled log-normally per row. Heavy-tailed: kurtosis far above a Gaussian's 3.
  const auto p = delta(d.path() / "captured", "paris", 0, 2);
  ASSERT_GT(p.size(), 1000u);
  double m2 = 0, m4 = 0, mean_abs = 0;
  for (float x : p) {
    m2 += double(x) * x;
    m4 += double(x) * x * x * x;
    mean_abs += std::fabs(x);
  }
  m2 /= double(p.size());
  m4 /= double(p.size());
  mean_abs /= double(p.size());
  EXPECT_GT(m4 / (m2 * m2), 8.0) << "kurtosis";
  // Student-t(3) has E|t| = 2 sqrt(3) / pi = 1.10, and E exp(N(0,1)) = 1.65: about 9e-3 here.
  EXPECT_GT(mean_abs, 5 * 1e-3 * 0.5);
  EXPECT_LT(mean_abs, 5 * 1e-3 * 4.0);
  // The other site drifts elsewhere: the same elements, another direction.
  const auto l = delta(d.path() / "captured", "lyon", 0, 2);
  ASSERT_EQ(l.size(), p.size());
  double dot = 0, ll = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    dot += double(p[i]) * l[i];
    ll += double(l[i]) * l[i];
  }
  EXPECT_LT(std::fabs(dot) / std::sqrt(m2 * double(p.size()) * ll), 0.2) << "the sites' directions correlate";
}

// outer.pace: time with a rehearsal: a site 4x slower trains about one step of each period of
// 5, never the period's first (where the stand-in moves the shard), and must still drift once
// per period: its pseudo-gradients after the first round are not zero.
TEST(Rehearsal, ASlowerSiteUnderPaceTimeStillDriftsEveryPeriod) {
  TempDir d;
  d.file("k.psk", "0123456789abcdef-test-key");
  const auto cfg = trainer::load_run_config(
      d.file("c.yaml", rehearsal_config(d.path() / "out", "{step_seconds: 0.01, drift: 1.0e-3}")),
      {"outer.pace=time", "outer.weighting=tokens", "sites.1.slowdown=4"});
  geoloco::testing::RankSetup setup;
  setup.hooks.capture_dir = (d.path() / "captured").string();
  std::filesystem::create_directories(setup.hooks.capture_dir);
  const auto out = geoloco::testing::run_ranks(cfg, 0, false, setup);
  std::set<std::string> global;
  for (const auto& s : out) global.insert(s["global_weights_hash"].get<std::string>());
  EXPECT_EQ(global.size(), 1u);
  const auto& lyon = out[2];  // lyon rank 0
  ASSERT_EQ(lyon["site"], "lyon");
  EXPECT_GE(lyon["steps_skipped"].get<int>(), 6) << "periods 2-4 train about 1 of 5 steps";
  for (int round : {2, 3, 4}) {
    const auto v = delta(d.path() / "captured", "lyon", 0, round);
    double mean_abs = 0;
    for (float x : v) mean_abs += std::fabs(x);
    mean_abs /= double(v.size());
    EXPECT_GT(mean_abs, 5 * 1e-3 * 0.5) << "round " << round << ": lyon's shard did not move";
  }
}

TEST(Rehearsal, ConfigRefusesBadSettings) {
  TempDir d;
  d.file("k.psk", "0123456789abcdef-test-key");
  for (const auto& [bad, words] :
       std::vector<std::pair<std::string, std::string>>{{"{step_seconds: 0}", "train.rehearsal.step_seconds"},
                                                        {"{drift: -1}", "train.rehearsal.drift"},
                                                        {"{steps: 3}", "steps"}}) {
    try {
      trainer::load_run_config(d.file("c.yaml", rehearsal_config(d.path() / "out", bad)));
      ADD_FAILURE() << "accepted " << bad;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  }
  // The stand-in inner loop runs on the host: a GPU site is refused (where CUDA is built in;
  // elsewhere device: cuda is refused before).
  try {
    trainer::load_run_config(d.file("c.yaml", rehearsal_config(d.path() / "out", "{step_seconds: 1}")),
                             {"sites.1.device=cuda"});
    ADD_FAILURE() << "accepted a rehearsal on a GPU site";
  } catch (const ConfigError& e) {
    const std::string want = trainer::built_with_cuda() ? "rehearse with device: cpu" : "device";
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what() << " / " << want;
  }
}

// outer.pace: time (outer_optimizer/pace.hpp): a slower site trains fewer inner steps per
// period. The share arithmetic, and runs with one site slowed down (sites[].slowdown), ranks
// as threads in this process.
#include <gtest/gtest.h>

#include "tests/trainer/loop/test_util.hpp"
#include "multisite_util.hpp"
#include "outer_optimizer/pace.hpp"
#include "tests/support/ports.hpp"
#include "core/error.hpp"
#include "trainer/loop/run_config.hpp"

using namespace geoloco;
using geoloco::test::fresh_port;
using geoloco::test::TempDir;
using outer::Pace;

TEST(Pace, APeriodTrainsItsDutySpreadEvenlyEndingOnTheSyncStep) {
  for (int64_t H : {1, 2, 7, 8, 50}) {
    for (int64_t d = 1; d <= H; ++d) {
      int64_t n = 0, longest_gap = 0, gap = 0;
      for (int64_t j = 0; j < H; ++j) {
        if (Pace::trained_at(j, d, H)) {
          ++n;
          gap = 0;
        } else {
          longest_gap = std::max(longest_gap, ++gap);
        }
      }
      EXPECT_EQ(n, d) << H << " " << d;
      EXPECT_TRUE(Pace::trained_at(H - 1, d, H)) << "the sync step is trained: " << H << " " << d;
      // Evenly: never more skipped in a row than the duty's spacing allows.
      EXPECT_LE(longest_gap, (H + d - 1) / d) << H << " " << d;
    }
  }
  EXPECT_EQ(Pace::duty(Pace::kWhole, 20), 20);
  EXPECT_EQ(Pace::duty(Pace::kWhole / 2, 20), 10);
  EXPECT_EQ(Pace::duty(340000, 20), 7);  // 6.8 rounds to 7
  EXPECT_EQ(Pace::duty(1, 20), 1);       // at least one step
}

TEST(Pace, TheRatioIsTheFastestTimeOverOwnWithinATolerance) {
  EXPECT_EQ(Pace::ratio_from({100000, 200000}, 0, 0.05), Pace::kWhole);
  EXPECT_EQ(Pace::ratio_from({100000, 200000}, 1, 0.05), Pace::kWhole / 2);
  EXPECT_EQ(Pace::ratio_from({100000, 104000}, 1, 0.05), Pace::kWhole);  // within 5%: every step
  EXPECT_EQ(Pace::ratio_from({100000, 104000}, 1, 0.0), 961538u);
  // A site with no report (not a contributor) is left out of the fastest; a self without one has none.
  EXPECT_EQ(Pace::ratio_from({0, 300000, 100000}, 1, 0.05), 333333u);
  EXPECT_FALSE(Pace::ratio_from({100000, 0}, 1, 0.05));
  EXPECT_FALSE(Pace::ratio_from({100000}, 3, 0.05));
}

TEST(Pace, ADecisionAppliesFromTheNextPeriodAndSurvivesACheckpoint) {
  Pace p;
  // Period 1 (steps 1-4, H 4): every step; a decision of 1/2 lands mid-period.
  EXPECT_TRUE(p.trains(1, 0, 4));
  p.decide(Pace::kWhole / 2);
  for (int64_t s = 2; s <= 4; ++s) EXPECT_TRUE(p.trains(s, 0, 4)) << s;
  // Period 2: steps 6 and 8.
  std::vector<bool> got;
  for (int64_t s = 5; s <= 8; ++s) got.push_back(p.trains(s, 0, 4));
  EXPECT_EQ(got, (std::vector<bool>{false, true, false, true}));
  const std::string saved = p.save();
  Pace q;
  q.restore(saved, "ckpt");
  EXPECT_EQ(q.ratio_ppm(), Pace::kWhole / 2);
  EXPECT_FALSE(q.trains(9, 0, 4));
  for (const char* bad : {"", "1,2", "0,5,3", "5,2000000,3", "5,5,-2", "5,5,3x"})
    EXPECT_THROW(q.restore(bad, "ckpt"), Error) << bad;
  // The step time reported: the median of the samples since the last report, kept when none.
  for (double t : {0.010, 0.030, 0.011, 0.5, 0.012}) p.sample(t);
  EXPECT_EQ(p.take_step_us(), 12000u);
  EXPECT_EQ(p.take_step_us(), 12000u);
}

namespace {

std::string pace_config(const std::filesystem::path& out, int steps, const std::string& outer) {
  const int port = fresh_port();
  return "run: {name: pace, seed: 3, output_dir: " + out.string() +
         "}\n"
         "model: {n_layer: 2, n_head: 2, n_embd: 64, block_size: 32, vocab_size: 32}\n"
         "data:\n  train: {kind: synthetic, vocab: 32, branching: 3, seed: 5, tokens: 400000}\n"
         "train: {steps: " +
         std::to_string(steps) +
         ", micro_batch: 8, log_every: 4, checkpoint_every: 16, optimizer: {lr: 3.0e-3}}\n"
         "outer: {interval: 8, compression: {codec: int8, block: 64}, " +
         outer +
         "}\n"
         "sites:\n"
         "  - {name: paris, ranks: 1, port: " +
         std::to_string(port) +
         "}\n"
         "  - {name: lyon, ranks: 2, strategy: zero1, slowdown: 4, port: " +
         std::to_string(port + 10) +
         "}\n"
         "transport: {psk_file: k.psk, timeout_s: 30}\n";
}

const nlohmann::json& rank_summary(const std::vector<nlohmann::json>& out, int g) {
  return g == 0 ? out[0]["ranks"][0] : out[static_cast<size_t>(g)];
}

}  // namespace

// A site 4x slower (lyon: 2 ranks, each step sleeping 3x its compute) trains about a quarter of
// each period's steps after the first round, both its ranks alike (a zero1 site: a rank that
// trained a step the other skipped would hang the site's collectives); paris trains every
// step; every rank ends on one hash, and the rounds weigh lyon by its fewer tokens. Under
// pace: steps the same slow site trains every step.
TEST(Pace, ASlowerSiteTrainsFewerStepsAndEverySiteAgrees) {
  TempDir d;
  d.file("k.psk", "0123456789abcdef-test-key");
  auto cfg =
      trainer::load_run_config(d.file("c.yaml", pace_config(d.path() / "out", 32, "pace: time, weighting: tokens")));
  const auto out = geoloco::testing::run_ranks(cfg);
  geoloco::testing::expect_one_hash(out[0], 3, "pace: time");
  const auto& paris = rank_summary(out, 0);
  EXPECT_EQ(paris["steps_skipped"].get<int64_t>(), 0);
  EXPECT_EQ(paris["pace"]["trained_steps"].get<int64_t>(), 32);
  for (int g : {1, 2}) {
    const auto& lyon = rank_summary(out, g);
    EXPECT_EQ(lyon["steps"].get<int64_t>(), 32);
    const int64_t skipped = lyon["steps_skipped"].get<int64_t>();
    // Period 1 trains all 8; periods 2-4 about 2 of 8 each (the sync step always).
    EXPECT_GE(skipped, 9) << g;
    EXPECT_LE(skipped, 21) << g;
    EXPECT_EQ(lyon["pace"]["trained_steps"].get<int64_t>(), 32 - skipped) << g;
    EXPECT_EQ(lyon["steps_skipped"], rank_summary(out, 1)["steps_skipped"]) << "both lyon ranks alike";
    EXPECT_GE(lyon["pace"]["decisions"].size(), 1u);
    EXPECT_LT(lyon["pace"]["ratio"].get<double>(), 0.6);
  }
  // Tokens committed by site: what each trained (lyon: 2 ranks x 8 sequences of 32 per step
  // trained; paris: 1 x 8 x 32), the weights of their contributions.
  const auto& by_site = paris["membership"]["tokens"]["committed_by_site"];
  EXPECT_EQ(by_site["paris"].get<int64_t>(), 32 * 8 * 32) << by_site.dump();
  EXPECT_EQ(by_site["lyon"].get<int64_t>(), rank_summary(out, 1)["pace"]["trained_steps"].get<int64_t>() * 16 * 32)
      << by_site.dump();
  // The rounds carry both sites' step times, lyon's the longer.
  std::ifstream rounds(d.path() / "out" / "sites" / "paris" / "rounds.r0.jsonl");
  std::string line;
  int n = 0;
  while (std::getline(rounds, line)) {
    const auto r = nlohmann::json::parse(line);
    const auto us = r["pace"]["step_us"];
    ASSERT_EQ(us.size(), 2u) << line;
    EXPECT_GT(us[1].get<uint32_t>(), us[0].get<uint32_t>()) << line;
    EXPECT_GT(us[0].get<uint32_t>(), 0u) << line;
    ++n;
  }
  EXPECT_EQ(n, 4);

  // pace: steps: the slow site trains every step (and the others wait for it).
  TempDir e;
  e.file("k.psk", "0123456789abcdef-test-key");
  auto steps =
      trainer::load_run_config(e.file("c.yaml", pace_config(e.path() / "out", 16, "pace: steps, weighting: tokens")));
  const auto out2 = geoloco::testing::run_ranks(steps);
  geoloco::testing::expect_one_hash(out2[0], 3, "pace: steps");
  for (int g : {0, 1, 2}) EXPECT_EQ(rank_summary(out2, g)["steps_skipped"].get<int64_t>(), 0) << g;
}

// The ratio in force is checkpointed: a run stopped at step 16 resumes its next period at the
// slow site's saved share (without it that period would train every step).
TEST(Pace, AResumedRunKeepsTheSlowSitesShare) {
  TempDir d;
  d.file("k.psk", "0123456789abcdef-test-key");
  auto cfg =
      trainer::load_run_config(d.file("c.yaml", pace_config(d.path() / "out", 24, "pace: time, weighting: tokens")));
  geoloco::testing::run_ranks(cfg, /*stop_at=*/16);
  const auto out = geoloco::testing::run_ranks(cfg, 0, /*resume=*/true);
  geoloco::testing::expect_one_hash(out[0], 3, "resumed");
  for (int g : {1, 2}) {
    const auto& lyon = rank_summary(out, g);
    EXPECT_EQ(lyon["steps"].get<int64_t>(), 24);
    EXPECT_GE(lyon["steps_skipped"].get<int64_t>(), 3) << "steps 17-24 at the saved share";
  }
  EXPECT_EQ(rank_summary(out, 0)["steps_skipped"].get<int64_t>(), 0);
}

TEST(Pace, ConfigRefusesTimeWithoutTokenWeights) {
  TempDir d;
  d.file("k.psk", "0123456789abcdef-test-key");
  const auto err = [&](const std::string& outer) {
    try {
      trainer::load_run_config(d.file("c.yaml", pace_config(d.path() / "out", 16, outer)));
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("<accepted>");
  };
  EXPECT_NE(err("pace: time").find("set outer.weighting: tokens"), std::string::npos) << err("pace: time");
  EXPECT_NE(err("pace: walltime").find("expected one of steps | time"), std::string::npos);
  EXPECT_NE(err("pace_tolerance: 0.1").find("only used with pace: time"), std::string::npos);
  EXPECT_NE(err("pace: time, weighting: tokens, pace_tolerance: 2").find("pace_tolerance"), std::string::npos);
}

// outer.plan: auto -- the decision (pure), its wire form, recalibration, and multi-site runs
// in which every rank must apply the same plans at the same steps.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <fstream>
#include <set>

#include "tests/trainer/loop/test_util.hpp"
#include "tests/support/ports.hpp"
#include "multisite_util.hpp"
#include "outer_optimizer/auto_plan.hpp"
#include "outer_optimizer/local_cost.hpp"
#include "core/config_node.hpp"
#include "core/error.hpp"
#include "trainer/loop/run_config.hpp"

using namespace geoloco;
using geoloco::test::fresh_port;
using geoloco::test::TempDir;

namespace {

outer::OuterConfig outer_from(const std::string& yaml) {
  auto doc = config::load_string(yaml, "o.yaml");
  return outer::OuterConfig::from_yaml(doc.node().child("outer"));
}

outer::PlanRequest request(const outer::OuterConfig& o, double rtt_ms, double mbit, double step_ms) {
  outer::PlanRequest r;
  r.params = 124e6;
  r.sites = 2;
  r.ranks = 8;
  r.transport_lanes = 4;
  r.n_layer = 12;
  r.path.rtt_s = rtt_ms / 1e3;
  r.path.rtt_p99_s = rtt_ms * 1.1 / 1e3;
  r.path.per_connection_Bps = mbit * 1e6 / 8 / 4;
  r.path.path_Bps = mbit * 1e6 / 8;
  r.path.connections = 4;
  r.step_time_s = step_ms / 1e3;
  r.outer = &o;
  return r;
}

std::string sites(int count, int ranks, const std::string& strategy) {
  return geoloco::testing::sites_yaml(count, ranks, fresh_port(), strategy);
}

trainer::RunConfig load(TempDir& d, const std::string& yaml) {
  d.file("k.psk", "0123456789abcdef-test-key");
  return trainer::load_run_config(d.file("c.yaml", yaml));
}

std::string run_yaml(const std::filesystem::path& out, int steps, const std::string& outer,
                     const std::string& sites_yaml, const std::string& emulate) {
  return "run: {name: ap, seed: 3, output_dir: " + out.string() +
         "}\n"
         "model: {n_layer: 4, n_head: 2, n_embd: 32, block_size: 16, vocab_size: 32}\n"
         "data:\n  train: {kind: synthetic, vocab: 32, branching: 3, seed: 5, tokens: 400000}\n"
         "train: {steps: " +
         std::to_string(steps) +
         ", micro_batch: 4, log_every: 5, optimizer: {lr: 3.0e-3}}\n"
         "outer: {" +
         outer + "}\n" + sites_yaml + "transport: {psk_file: k.psk, timeout_s: 30, lanes: 2, emulate: {" + emulate +
         "}}\n";
}

// Every rank's plans, as JSON text, must be the same.
void expect_same_plans(const std::vector<nlohmann::json>& ranks) {
  ASSERT_FALSE(ranks.empty());
  const std::string first = ranks[0]["plans"].dump();
  std::set<std::string> hashes;
  for (auto& r : ranks) {
    EXPECT_EQ(r["plans"].dump(), first) << "rank " << r.value("global_rank", -1);
    hashes.insert(r["params_hash"].get<std::string>());
  }
  EXPECT_EQ(hashes.size(), 1u);
}

}  // namespace

TEST(AutoPlanConfig, DefaultsAndRejections) {
  auto c = outer_from("outer: {interval: 10}\n");
  EXPECT_EQ(c.plan, outer::PlanKind::Manual);
  EXPECT_FALSE(c.auto_plan());
  EXPECT_EQ(c.target_utilization, 0.95);
  EXPECT_EQ(c.plan_bits, (std::vector<int>{16, 8, 4}));
  auto a = outer_from("outer: {plan: auto, target_utilization: 0.99, plan_bits: [8, 4, 2], plan_h_min: 10}\n");
  EXPECT_TRUE(a.auto_plan());
  EXPECT_EQ(a.plan_bits, (std::vector<int>{8, 4, 2}));
  EXPECT_THROW(outer_from("outer: {plan: sometimes}\n"), ConfigError);
  EXPECT_THROW(outer_from("outer: {plan: auto, plan_bits: [3]}\n"), ConfigError);
  EXPECT_THROW(outer_from("outer: {plan: auto, plan_bits: []}\n"), ConfigError);
  EXPECT_THROW(outer_from("outer: {plan: auto, plan_h_min: 50, plan_h_max: 10}\n"), ConfigError);
  EXPECT_THROW(outer_from("outer: {plan: auto, target_utilization: 1.5}\n"), ConfigError);
  EXPECT_THROW(outer_from("outer: {plan: auto, compression: {codec: int8, topk: 0.1}}\n"), ConfigError);
  EXPECT_THROW(outer_from("outer: {plan: auto, inner_state: reset}\n"), ConfigError);
}

TEST(AutoPlan, ChoosesTheSmallestIntervalThatMeetsTheTarget) {
  auto o = outer_from("outer: {plan: auto, target_utilization: 0.95, plan_h_min: 1, plan_h_max: 100000}\n");
  // 124M parameters, 100 ms RTT, 1 Gbit/s, 300 ms steps, blocking.
  auto d = outer::choose_plan(request(o, 100, 1000, 300));
  EXPECT_TRUE(d.target_met) << d.reason;
  EXPECT_GE(d.predicted_utilization, 0.95);
  EXPECT_EQ(d.codec, outer::codec_for_bits(d.bits));
  EXPECT_GE(d.lanes, 1);
  EXPECT_LE(d.lanes, 4);
  // One step less would miss the target with the same fragments and bits.
  auto o2 = o;
  o2.plan_bits = {d.bits};
  o2.plan_h_max = d.interval - 1;
  o2.plan_h_min = std::min<int64_t>(o2.plan_h_min, o2.plan_h_max);
  auto below = outer::choose_plan(request(o2, 100, 1000, 300));
  EXPECT_TRUE(!below.target_met || below.fragments != d.fragments) << below.reason;
  // A faster link never needs a larger H; a slower one never a smaller H.
  auto fast = outer::choose_plan(request(o, 100, 10000, 300));
  auto slow = outer::choose_plan(request(o, 100, 100, 300));
  EXPECT_LE(fast.interval, d.interval);
  EXPECT_GE(slow.interval, d.interval);
  EXPECT_NE(d.reason.find("Chose H = " + std::to_string(d.interval)), std::string::npos) << d.reason;
  EXPECT_NE(d.reason.find("RTT 100.00 ms"), std::string::npos) << d.reason;
  // Overlap hides the sync: a smaller H suffices.
  auto ov = outer_from("outer: {plan: auto, overlap_steps: 20, plan_h_min: 1, plan_h_max: 100000}\n");
  EXPECT_LE(outer::choose_plan(request(ov, 100, 1000, 300)).interval, d.interval);
}

// outer.exchange: auto: the plan weighs the owner exchange against all_to_all with the same
// model. Eight sites on a slow link are bandwidth-bound: the owner's 2(S-1)/S of a shard reaches
// the target at a smaller H. Two sites send the same bytes either way and the owner pays a
// second round trip: all_to_all. The decision says so and round-trips through JSON; a plan of
// an unknown exchange is refused.
TEST(AutoPlan, ExchangeAutoWeighsTheOwnerExchangeWithTheSameModel) {
  auto o = outer_from("outer: {plan: auto, exchange: auto, plan_h_min: 1, plan_h_max: 100000}\n");
  auto wide = request(o, 20, 1000, 300);
  wide.sites = 8;
  const auto d = outer::choose_plan(wide);
  EXPECT_EQ(d.exchange, outer::ExchangeKind::Owner) << d.reason;
  EXPECT_NE(d.reason.find("exchange owner (outer.exchange: auto)"), std::string::npos) << d.reason;
  auto fixed = o;
  fixed.exchange = outer::ExchangeKind::AllToAll;
  wide.outer = &fixed;
  const auto a2a = outer::choose_plan(wide);
  EXPECT_EQ(a2a.exchange, outer::ExchangeKind::AllToAll);
  EXPECT_GT(a2a.interval, d.interval) << "the owner exchange should need fewer steps per sync here";
  fixed.exchange = outer::ExchangeKind::Owner;  // chosen by the config: the plan prices and keeps it, even on two sites
  auto pair_owner = request(fixed, 100, 100000, 300);
  EXPECT_EQ(outer::choose_plan(pair_owner).exchange, outer::ExchangeKind::Owner);
  auto pair = request(o, 100, 100000, 300);
  EXPECT_EQ(outer::choose_plan(pair).exchange, outer::ExchangeKind::AllToAll);
  const auto back = outer::PlanDecision::from_json(d.to_json(), "test");
  EXPECT_EQ(back.exchange, outer::ExchangeKind::Owner);
  EXPECT_FALSE(back.same_schedule(a2a));
  auto j = d.to_json();
  j["exchange"] = "tree";
  EXPECT_THROW(outer::PlanDecision::from_json(j, "test"), Error);
  j.erase("exchange");  // a plan written before the owner exchange
  EXPECT_EQ(outer::PlanDecision::from_json(j, "test").exchange, outer::ExchangeKind::AllToAll);
  EXPECT_THROW(outer_from("outer: {exchange: auto}\n"), ConfigError);  // needs plan: auto
}

// The quality floor (planner/quality_floor.hpp): on a link fast enough for a small H, an outer
// lr above 0.7 keeps the plan at H >= 25 (the grid measured lr 1.0 at H 10 far worse).
TEST(AutoPlan, ALargeOuterLrKeepsHAtTwentyFiveOrMore) {
  auto gentle = outer_from("outer: {plan: auto, plan_h_min: 1, optimizer: {kind: nesterov, lr: 0.7}}\n");
  auto large = outer_from("outer: {plan: auto, plan_h_min: 1, optimizer: {kind: nesterov, lr: 1.0}}\n");
  const auto g = outer::choose_plan(request(gentle, 1, 100000, 300));
  const auto l = outer::choose_plan(request(large, 1, 100000, 300));
  EXPECT_LT(g.interval, 25) << g.reason;
  EXPECT_GE(l.interval, 25) << l.reason;
}

// The transport's eager size sets the latency per round: a small model's messages fit the
// default 8 MiB (0.5 RTT); with eager_bytes 0 they pay the rendezvous (1.5 RTT), so the same
// plan predicts a sync one RTT longer and never needs a smaller H; emulation pins 0.5.
TEST(AutoPlan, LatencyFollowsTheTransportsEagerSize) {
  auto o = outer_from(
      "outer: {plan: auto, target_utilization: 0.95, plan_h_min: 1, plan_h_max: 100000, "
      "plan_bits: [8]}\n");
  auto small = request(o, 100, 1000, 300);
  small.params = 1e6;  // 1 MB per site at 8 bits, 125 KB per rank: fits
  const auto eager = outer::choose_plan(small);
  small.eager_bytes = 0;
  const auto rndv = outer::choose_plan(small);
  EXPECT_GE(rndv.interval, eager.interval);
  auto same = small;
  auto fixed = o;
  fixed.plan_h_min = fixed.plan_h_max = eager.interval;
  same.outer = &fixed;
  const auto at_h_rndv = outer::choose_plan(same);
  same.eager_bytes = 8.0 * (1 << 20);
  const auto at_h_eager = outer::choose_plan(same);
  ASSERT_EQ(at_h_rndv.fragments, at_h_eager.fragments);
  EXPECT_NEAR(at_h_rndv.predicted_fragment_sync_s - at_h_eager.predicted_fragment_sync_s, 0.100, 1e-9);
  same.eager_bytes = 0;
  same.rtts_per_round = 0.5;  // transport.emulate
  EXPECT_NEAR(outer::choose_plan(same).predicted_fragment_sync_s, at_h_eager.predicted_fragment_sync_s, 1e-12);
}

TEST(AutoPlan, PicksTheFewestLanesThatReachTheTarget) {
  // A window-bound path: one connection carries 1/8 of the link. At the H floor more lanes
  // are what reaches the target; on a path one connection fills, one lane suffices.
  auto o =
      outer_from("outer: {plan: auto, target_utilization: 0.95, plan_h_min: 50, plan_h_max: 50, plan_bits: [8]}\n");
  auto req = request(o, 100, 8000, 200);
  req.ranks = 1;  // one connection per lane between the sites
  req.transport_lanes = 8;
  req.path.per_connection_Bps = req.path.path_Bps / 8;
  req.path.connections = 8;
  auto bound = outer::choose_plan(req);
  EXPECT_TRUE(bound.target_met) << bound.reason;
  EXPECT_GT(bound.lanes, 1) << bound.reason;
  req.path.per_connection_Bps = req.path.path_Bps;
  auto free = outer::choose_plan(req);
  EXPECT_EQ(free.lanes, 1) << free.reason;
}

TEST(AutoPlan, UnreachableTargetSaysWhy) {
  auto o =
      outer_from("outer: {plan: auto, target_utilization: 0.999, plan_h_min: 1, plan_h_max: 10, plan_bits: [16]}\n");
  auto d = outer::choose_plan(request(o, 500, 10, 100));
  EXPECT_FALSE(d.target_met);
  EXPECT_LE(d.interval, 10);
  EXPECT_NE(d.reason.find("not reachable"), std::string::npos) << d.reason;
  // No throughput or step time: an error, not a plan.
  auto bad = request(o, 500, 10, 100);
  bad.step_time_s = 0;
  EXPECT_THROW(outer::choose_plan(bad), Error);
  bad = request(o, 500, 0, 100);
  EXPECT_THROW(outer::choose_plan(bad), Error);
}

// The outer loop's own time per sync (local_cost.hpp) is part of every fragment sync the plan
// predicts, per codec width: a codec that is slow on this host costs H like a slow link does.
TEST(AutoPlan, TheOuterLoopsOwnTimeCountsPerCodecWidth) {
  auto o = outer_from(
      "outer: {plan: auto, target_utilization: 0.95, plan_h_min: 1, plan_h_max: 100000, "
      "plan_bits: [8, 4]}\n");
  auto req = request(o, 20, 10000, 300);
  const auto free_local = outer::choose_plan(req);
  ASSERT_TRUE(free_local.target_met) << free_local.reason;
  // int4 and int8 each take 2 s of the host's time per sync: H grows to hide it.
  req.local_sync_s = {{8, 2.0}, {4, 2.0}};
  const auto slow = outer::choose_plan(req);
  EXPECT_GT(slow.interval, free_local.interval) << slow.reason;
  EXPECT_GE(slow.predicted_fragment_sync_s, 2.0 / slow.fragments);
  EXPECT_NE(slow.reason.find("(4 bits 2000 ms, 8 bits 2000 ms)"), std::string::npos) << slow.reason;
  // Only int4 is slow here: the plan prefers int8 at the same or a smaller H.
  req.local_sync_s = {{8, 0.01}, {4, 20.0}};
  const auto pick = outer::choose_plan(req);
  EXPECT_EQ(pick.bits, 8) << pick.reason;
  // The costs travel with the decision (re-plans use them) and are checked when read.
  const auto back = outer::PlanDecision::from_json(pick.to_json(), "test");
  EXPECT_EQ(back.local_sync_s, req.local_sync_s);
  auto j = pick.to_json();
  j["local_sync_s"] = {{"3", 1.0}};
  EXPECT_THROW(outer::PlanDecision::from_json(j, "test"), geoloco::Error);
  j["local_sync_s"] = {{"4", -1.0}};
  EXPECT_THROW(outer::PlanDecision::from_json(j, "test"), geoloco::Error);
  j.erase("local_sync_s");  // a plan written before it was measured
  EXPECT_TRUE(outer::PlanDecision::from_json(j, "test").local_sync_s.empty());
}

TEST(LocalCost, EveryWidthIsTimedAndAnEmptyShardCostsNothing) {
  compression::PipelineConfig base;
  base.zstd_level = 1;
  const auto m = outer::measure_local_sync_s(base, {16, 8, 4}, 3, 1u << 18, 1u << 16);
  ASSERT_EQ(m.size(), 3u);
  for (const auto& [b, s] : m) EXPECT_GT(s, 0.0) << b;
  for (const auto& [b, s] : outer::measure_local_sync_s(base, {8, 2}, 2, 0)) EXPECT_EQ(s, 0.0) << b;
}

TEST(AutoPlan, DecisionRoundTripsAndMalformedIsRejected) {
  auto o = outer_from("outer: {plan: auto, plan_h_min: 1}\n");
  auto d = outer::choose_plan(request(o, 20, 1000, 100));
  d.epoch = 3;
  auto back = outer::PlanDecision::from_json(nlohmann::json::parse(d.to_json().dump()), "peer");
  EXPECT_EQ(back.to_json(), d.to_json());
  EXPECT_TRUE(back.same_schedule(d));
  auto j = d.to_json();
  j.erase("interval");
  EXPECT_THROW(outer::PlanDecision::from_json(j, "lyon/0"), Error);
  j = d.to_json();
  j["codec"] = "int3";
  try {
    outer::PlanDecision::from_json(j, "lyon/0");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("lyon/0"), std::string::npos) << e.what();
  }
  j = d.to_json();
  j["fragments"] = j["interval"].get<int64_t>() + 1;
  EXPECT_THROW(outer::PlanDecision::from_json(j, "x"), Error);
  EXPECT_THROW(outer::PlanDecision::from_json(nlohmann::json::parse("[1,2]"), "x"), Error);
}

TEST(AutoPlan, RecalibrationRecoversTheRate) {
  auto o = outer_from("outer: {plan: auto, plan_h_min: 1, plan_bits: [8]}\n");
  auto req = request(o, 40, 1000, 200);
  auto d = outer::choose_plan(req);
  // What the model predicts, with d's schedule, when the link is really 4x slower...
  const double measured = [&] {
    auto slow = req;
    slow.capacity_scale = 0.25;
    auto o1 = o;
    o1.plan_h_min = o1.plan_h_max = d.interval;
    slow.outer = &o1;
    return outer::choose_plan(slow).predicted_fragment_sync_s;
  }();
  // ... is recovered from that measured time.
  EXPECT_NEAR(outer::calibrated_capacity_scale(req, d, measured), 0.25, 0.01);
  EXPECT_NEAR(outer::calibrated_capacity_scale(req, d, d.predicted_fragment_sync_s), 1.0, 0.01);
  EXPECT_TRUE(outer::drifted(1.0, 1.6, 0.5));
  EXPECT_FALSE(outer::drifted(1.0, 1.4, 0.5));
  EXPECT_TRUE(outer::drifted(1.0, 0.4, 0.5));
  EXPECT_FALSE(outer::drifted(0.0, 5.0, 0.5));
  EXPECT_EQ(outer::codec_for_bits(4), "int4");
  EXPECT_THROW(outer::codec_for_bits(3), Error);
}

// 2 sites x 2 ranks (zero1): the sites probe each other during the first steps, site 0
// plans, and every rank of every site runs the same plan; plan.json holds it with its
// reasoning. Re-planning is off (a huge threshold): on a loaded machine the measured
// sync and step times drift from the probe's and a second plan would legitimately
// replace the first (DriftReplansOnEverySiteAtTheSameStep covers that).
TEST(AutoPlan, EverySiteAndRankRunsTheSamePlan) {
  TempDir d;
  auto cfg = load(d, run_yaml(d.path() / "out", 40,
                              "plan: auto, overlap_steps: 2, plan_measure_steps: 4, plan_probe_seconds: 0.4, "
                              "plan_h_min: 6, plan_h_max: 30, target_utilization: 0.9, replan_threshold: 1000, "
                              "compression: {codec: fp32}",
                              sites(2, 2, "zero1"), "delay_ms: 2, rate_mbit: 200"));
  auto ranks = geoloco::testing::run_ranks(cfg);
  auto& s = ranks[0];
  ASSERT_TRUE(s.contains("plans")) << s.dump().substr(0, 500);
  expect_same_plans(ranks);
  ASSERT_EQ(s["plans"].size(), 1u) << s["plans"].dump();
  const auto& p = s["plans"][0];
  EXPECT_EQ(p["epoch"].get<int>(), 1);
  EXPECT_GE(p["interval"].get<int>(), 6);
  EXPECT_LE(p["interval"].get<int>(), 30);
  EXPECT_GT(p["path"]["rtt_s"].get<double>(), 0.003);  // 2 ms each way, at least
  EXPECT_GT(p["step_time_s"].get<double>(), 0.0);
  // The plan's schedule is the one that ran.
  EXPECT_EQ(s["outer_interval"], p["interval"]);
  EXPECT_EQ(s["outer_fragments"], p["fragments"]);
  auto plan_json = nlohmann::json::parse(std::ifstream(d.path() / "out" / "plan.json"));
  EXPECT_EQ(plan_json["format"], "geoloco-plan");
  EXPECT_EQ(plan_json["plans"][0]["reason"], p["reason"]);
  EXPECT_NE(p["reason"].get<std::string>().find("Chose H ="), std::string::npos);
  // The outer loop's own time per sync was measured for every width the plan may pick (here
  // plan_bits' default 16/8/4), and the prediction carries the chosen width's share.
  ASSERT_TRUE(p.contains("local_sync_s")) << p.dump();
  for (const char* b : {"16", "8", "4"}) EXPECT_GT(p["local_sync_s"].value(b, 0.0), 0.0) << p.dump();
  EXPECT_GE(p["predicted_fragment_sync_s"].get<double>(),
            p["local_sync_s"][std::to_string(p["bits"].get<int>())].get<double>() / p["fragments"].get<double>());
  EXPECT_NE(p["reason"].get<std::string>().find("the outer loop's own time per sync"), std::string::npos);
}

// outer.exchange: auto end to end: three sites on a slow emulated link (bandwidth-bound), so the
// start-up plan picks the owner exchange; every rank runs it (the summary's outer_exchange) and
// ends on one hash.
TEST(AutoPlan, ExchangeAutoRunsThePlansExchangeOnEveryRank) {
  TempDir d;
  auto cfg = load(d, run_yaml(d.path() / "out", 30,
                              "plan: auto, exchange: auto, min_sites: 3, plan_measure_steps: 4, "
                              "plan_probe_seconds: 0.3, plan_h_min: 6, plan_h_max: 30, target_utilization: 0.99, "
                              "replan_threshold: 1000, plan_bits: [32]",
                              sites(3, 1, "ddp"), "delay_ms: 1, rate_mbit: 200"));
  auto ranks = geoloco::testing::run_ranks(cfg);
  expect_same_plans(ranks);
  const auto& p = ranks[0]["plans"][0];
  EXPECT_EQ(p["exchange"], "owner") << p["reason"];
  for (const auto& r : ranks) EXPECT_EQ(r["outer_exchange"], "owner");
  geoloco::testing::expect_one_hash(ranks[0], 3, "exchange: auto");
}

// A link that gets 200x slower after step 20 (test hook scaling the measured sync times):
// site 0 re-plans from the reports, every site applies the new schedule at the same
// boundary, and the replicas stay identical. (The first plan may also be revised for the
// step time: it was timed while the probe ran on this 2-core machine.) Reports travel one
// period ahead, so the reaction takes up to three periods: the run is long enough.
TEST(AutoPlan, DriftReplansOnEverySiteAtTheSameStep) {
  TempDir d;
  geoloco::testing::RankSetup setup;
  setup.hooks.drift = outer::OuterHooks::Drift{20, 200};
  auto cfg = load(d, run_yaml(d.path() / "out", 400,
                              "plan: auto, plan_measure_steps: 4, plan_probe_seconds: 0.1, plan_h_min: 5, "
                              "plan_h_max: 150, target_utilization: 0.9, replan_threshold: 0.5, plan_bits: [16], "
                              "compression: {codec: fp32}",
                              sites(2, 1, "ddp"), "delay_ms: 1"));
  auto ranks = geoloco::testing::run_ranks(cfg, 0, false, setup);
  auto& s = ranks[0];
  expect_same_plans(ranks);
  ASSERT_GE(s["plans"].size(), 2u) << s["plans"].dump();
  EXPECT_GE(s["replans"].get<int>(), 1);
  const auto& first = s["plans"][0];
  const auto& last = s["plans"][s["plans"].size() - 1];
  EXPECT_GT(last["epoch"].get<int>(), first["epoch"].get<int>());
  // The link now looks 200x slower: recalibrated, and a longer interval to keep the target.
  EXPECT_LT(last["capacity_scale"].get<double>(), 0.1) << s["plans"].dump();
  EXPECT_GT(last["interval"].get<int>(), first["interval"].get<int>()) << s["plans"].dump();
  EXPECT_EQ(s["outer_interval"], last["interval"]);
}

// outer.exchange: auto across a re-plan: on fast loopback three sites are latency-bound and the
// start-up plan keeps all_to_all (one round); the link then looks 200x slower (the drift
// hook), the re-plan finds the syncs bandwidth-bound and switches to the owner exchange, and
// every rank switches at the same boundary (one hash at the end, the owner exchange in force).
TEST(AutoPlan, ExchangeAutoSwitchesAtARePlanOnEveryRank) {
  TempDir d;
  geoloco::testing::RankSetup setup;
  setup.hooks.drift = outer::OuterHooks::Drift{20, 200};
  auto cfg = load(d, run_yaml(d.path() / "out", 400,
                              "plan: auto, exchange: auto, min_sites: 3, plan_measure_steps: 4, "
                              "plan_probe_seconds: 0.1, plan_h_min: 5, plan_h_max: 150, target_utilization: 0.9, "
                              "replan_threshold: 0.5, plan_bits: [16], compression: {codec: fp32}",
                              sites(3, 1, "ddp"), "delay_ms: 1"));
  auto ranks = geoloco::testing::run_ranks(cfg, 0, false, setup);
  expect_same_plans(ranks);
  const auto& plans = ranks[0]["plans"];
  ASSERT_GE(plans.size(), 2u) << plans.dump();
  EXPECT_EQ(plans[0]["exchange"], "all_to_all") << plans[0]["reason"];
  EXPECT_EQ(plans[plans.size() - 1]["exchange"], "owner") << plans.dump();
  for (const auto& r : ranks) EXPECT_EQ(r["outer_exchange"], "owner");
  geoloco::testing::expect_one_hash(ranks[0], 3, "exchange switched at a re-plan");
}

// A run stopped after its plan resumes with that plan (same schedule, no second probe) and
// the sites stay identical.
TEST(AutoPlan, ResumeKeepsThePlan) {
  TempDir d;
  auto cfg = load(d, run_yaml(d.path() / "out", 60,
                              "plan: auto, plan_measure_steps: 4, plan_probe_seconds: 0.1, plan_h_min: 8, "
                              "plan_h_max: 12, target_utilization: 0.5, replan_threshold: 1000, "
                              "compression: {codec: int8}",
                              sites(2, 1, "ddp"), "delay_ms: 1"));
  auto before = geoloco::testing::run_ranks(cfg, 30)[0];
  ASSERT_EQ(before["plans"].size(), 1u) << before["plans"].dump();
  auto after = geoloco::testing::run_ranks(cfg, 0, true);
  expect_same_plans(after);
  auto& s = after[0];
  ASSERT_EQ(s["plans"].size(), 1u) << s["plans"].dump();
  EXPECT_EQ(s["plans"][0], before["plans"][0]);
  EXPECT_EQ(s["outer_interval"], before["plans"][0]["interval"]);
  EXPECT_EQ(s["replans"].get<int>(), 0);
}

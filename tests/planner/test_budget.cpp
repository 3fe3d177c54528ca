// geoloco budget: sync cost, overlap/utilization model, smallest-H search, budget YAML.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "planner/budget.hpp"
#include "tools/planner/budget_report.hpp"
#include "tools/planner/cli.hpp"
#include "planner/physics.hpp"
#include "core/config_node.hpp"

using namespace geoloco::planner;
using geoloco::ConfigError;
using geoloco::InputError;

namespace {

const char* kHeader = "format: geoloco-budget\nversion: 1\n";

BudgetInput parse(const std::string& body, const std::vector<std::string>& sets = {}) {
  auto doc = geoloco::config::load_string(kHeader + body, "budget.yaml", sets);
  return BudgetInput::from_yaml(doc.node());
}

std::string error_of(const std::string& text) {
  try {
    auto doc = geoloco::config::load_string(text, "budget.yaml");
    BudgetInput::from_yaml(doc.node());
  } catch (const InputError& e) {
    return e.what();
  }
  return "<no error>";
}

// 1T parameters in bf16, two sites 100 km apart, one 800 Gbit/s link.
const char* kTrillion = R"(
model: {params: 1T}
compression: {bits: 16}
sites: 2
link: {distance_km: 100, rate_gbps: 800, parallel_links: 1}
schedule: {step_time_s: 1.0, H: 100, ranks: 64, lanes: 1}
)";

}  // namespace

TEST(Budget, TrillionParameterSyncOnOneLinkTakesTwentySeconds) {
  auto in = parse(kTrillion);
  EXPECT_DOUBLE_EQ(in.params, 1e12);
  EXPECT_DOUBLE_EQ(in.rtt_s, 1e-3);
  auto c = sync_cost(in, in.bytes_per_value(), 1, 1);
  EXPECT_DOUBLE_EQ(c.payload_bytes, 2e12);
  EXPECT_DOUBLE_EQ(c.egress_bytes, 2e12);  // one peer
  EXPECT_EQ(c.connections, 64);
  // 64 connections x 3 MiB / 1 ms = 201 GB/s > 100 GB/s: the link is the limit.
  EXPECT_FALSE(c.bdp_bound);
  EXPECT_DOUBLE_EQ(c.rate_Bps, 100e9);
  EXPECT_DOUBLE_EQ(c.bandwidth_s, 20.0);
  EXPECT_EQ(c.rounds, 1);
  // 1.5 RTT for the rendezvous exchange (31 GB messages); the hash check is off the path.
  EXPECT_DOUBLE_EQ(c.check_s, 0.0);
  EXPECT_DOUBLE_EQ(c.latency_s, 1.5e-3);
  EXPECT_DOUBLE_EQ(c.local_s, 0.0);
  EXPECT_DOUBLE_EQ(c.total_s, 20.0 + 1.5e-3);
  // No overlap: utilization = H t / (H t + t_sync).
  auto e = evaluate(in, 100, 16, 2.0, 1, 1);
  EXPECT_DOUBLE_EQ(e.utilization, 100.0 / (100.0 + 20.0015));
}

TEST(Budget, FewConnectionsOnALongPathAreBandwidthDelayBound) {
  auto in = parse(R"(
model: {params: 1e9}
compression: {bits: 4, block: 128, scale_bytes: 4}
sites: 4
link: {rtt_ms: 40, rate_gbps: 10}
schedule: {step_time_s: 0.5, H: 100, ranks: 2, lanes: 1}
)");
  auto c = sync_cost(in, in.bytes_per_value(), 1, 1);
  const double payload = 1e9 * (0.5 + 4.0 / 128);
  EXPECT_DOUBLE_EQ(c.payload_bytes, payload);
  EXPECT_DOUBLE_EQ(c.egress_bytes, 3 * payload);
  EXPECT_EQ(c.connections, 3 * 2);
  const double cap = 3145728.0 / 0.040;
  EXPECT_DOUBLE_EQ(c.per_connection_cap_Bps, cap);
  EXPECT_TRUE(c.bdp_bound);
  EXPECT_DOUBLE_EQ(c.rate_Bps, 6 * cap);
  EXPECT_DOUBLE_EQ(c.bandwidth_s, 3 * payload / (6 * cap));
  // More lanes lift the cap until the link binds: 16 connections per pair -> 48 x cap
  // = 3.77 GB/s > 1.25 GB/s.
  auto c8 = sync_cost(in, in.bytes_per_value(), 1, 8);
  EXPECT_FALSE(c8.bdp_bound);
  EXPECT_DOUBLE_EQ(c8.rate_Bps, 1.25e9);

  auto r = plan_budget(in);
  EXPECT_EQ(r.connections_to_fill_link, 16);  // ceil(1.25e9 / 78.6e6) = ceil(15.9)
  EXPECT_DOUBLE_EQ(r.rmem_to_fill_link, 1.25e9 / 6 * 0.040 / 0.5);
}

TEST(Budget, RingPaysTwoSMinusOneRoundsOverOneNeighbour) {
  auto in = parse(R"(
model: {params: 1e9}
compression: {bits: 16}
sites: 4
link: {rtt_ms: 10, rate_gbps: 80}
schedule: {step_time_s: 0.5, ranks: 100, pattern: ring}
)");
  auto c = sync_cost(in, 2.0, 1, 1);
  EXPECT_DOUBLE_EQ(c.egress_bytes, 2.0 * 3 / 4 * 2e9);
  EXPECT_EQ(c.connections, 100);
  EXPECT_EQ(c.rounds, 6);
  // 3e9 bytes in 6 rounds over 100 ranks: 5 MB messages, within the 8 MiB eager size.
  EXPECT_DOUBLE_EQ(c.message_bytes, 3e9 / 6 / 100);
  EXPECT_DOUBLE_EQ(c.latency_s, 6 * 0.5 * 0.010);  // the hash check is off the sync path
  in.check_rtts = 0.5;                             // a waiting one: once per sync, not per round
  EXPECT_DOUBLE_EQ(sync_cost(in, 2.0, 1, 1).latency_s, 6 * 0.5 * 0.010 + 0.5 * 0.010);
  EXPECT_DOUBLE_EQ(c.rate_Bps, 10e9);  // 100 x 314 MB/s > 10 GB/s
  EXPECT_DOUBLE_EQ(c.bandwidth_s, 3e9 / 10e9);
}

// outer.exchange: owner: two rounds over all_to_all's connections, each site sending 1/S of its
// payload to every other site in each: 2(S-1)/S of it in all, against all_to_all's S-1.
TEST(Budget, OwnerSendsTwoSMinusOneOverSInTwoRoundsOverEverySite) {
  auto in = parse(R"(
model: {params: 1e9}
compression: {bits: 16}
sites: 8
link: {rtt_ms: 10, rate_gbps: 80}
schedule: {step_time_s: 0.5, ranks: 4, pattern: owner}
)");
  const auto c = sync_cost(in, 2.0, 1, 1);
  EXPECT_DOUBLE_EQ(c.egress_bytes, 2.0 * 7 / 8 * 2e9);
  EXPECT_EQ(c.connections, 7 * 4);
  EXPECT_EQ(c.rounds, 2);
  EXPECT_DOUBLE_EQ(c.message_bytes, c.egress_bytes / 2 / (7 * 4));
  in.pattern = Pattern::AllToAll;
  const auto a = sync_cost(in, 2.0, 1, 1);
  EXPECT_DOUBLE_EQ(a.egress_bytes, 7 * 2e9);
  EXPECT_EQ(a.connections, c.connections);
  EXPECT_DOUBLE_EQ(a.bandwidth_s / c.bandwidth_s, 4.0);  // (S-1) / (2(S-1)/S) = S/2
  EXPECT_DOUBLE_EQ(c.latency_s, 2 * a.latency_s);
  // The search weighs both where they differ: bandwidth-bound 8 sites take the owner exchange,
  // a latency-bound pair (equal bytes, twice the round trips) keeps all_to_all.
  in.step_time_s = 2;
  in.target_utilization = 0.99;
  in.search_patterns = {Pattern::AllToAll, Pattern::Owner};
  const auto wide = smallest_h(in);
  ASSERT_TRUE(wide.found) << wide.reason;
  EXPECT_EQ(wide.best.pattern, Pattern::Owner);
  auto pair = in;
  pair.sites = 2;
  pair.link_gbps = 1000;
  pair.rtt_s = 0.2;
  const auto two = smallest_h(pair);
  EXPECT_EQ(two.best.pattern, Pattern::AllToAll) << two.best.H;
  // plan_budget's report: the owner's full sync beside the others, and its search picks it too.
  in.search_patterns.clear();
  in.pattern = Pattern::AllToAll;
  const auto r = plan_budget(in);
  EXPECT_DOUBLE_EQ(r.owner_full_sync.egress_bytes, c.egress_bytes);
  EXPECT_EQ(r.search.best.pattern, Pattern::Owner);
  EXPECT_NE(error_of(std::string(kHeader) + "model: {params: 1e9}\nsites: 3\nlink: {rtt_ms: 1, rate_gbps: 1}\n"
                                            "schedule: {step_time_s: 1, pattern: tree}\n")
                .find("pattern"),
            std::string::npos);
}

// transport.eager_bytes: a message (one rank's slice for one peer) that fits it costs
// half a round trip, a longer one the rendezvous' 1.5; link.rtts_per_round overrides both.
TEST(Budget, EagerSizeSetsTheRoundTripsPerRound) {
  const std::string head =
      "model: {params: 4e7}\ncompression: {bytes_per_value: 1}\nsites: 3\n"
      "schedule: {step_time_s: 0.1, ranks: 2}\n";
  // 4e7 bytes per site, 2 ranks: each rank sends its 2e7-byte slice to each of 2 peers.
  auto in = parse(head + "link: {rtt_ms: 20, rate_gbps: 10, eager_bytes: 32MiB}\n");
  EXPECT_DOUBLE_EQ(in.eager_bytes, 32.0 * (1 << 20));
  auto c = sync_cost(in, 1.0, 1, 1);
  EXPECT_DOUBLE_EQ(c.message_bytes, 2e7);
  EXPECT_DOUBLE_EQ(c.rtts_per_round, 0.5);
  // The default 8 MiB prefix (8388608 bytes) covers neither 2e7 nor two fragments' 1e7-byte
  // messages; four fragments' 5e6 fit.
  in = parse(head + "link: {rtt_ms: 20, rate_gbps: 10}\n");
  EXPECT_DOUBLE_EQ(sync_cost(in, 1.0, 1, 1).rtts_per_round, 1.5);
  EXPECT_DOUBLE_EQ(sync_cost(in, 1.0, 2, 1).rtts_per_round, 1.5);
  EXPECT_DOUBLE_EQ(sync_cost(in, 1.0, 4, 1).rtts_per_round, 0.5);
  EXPECT_DOUBLE_EQ(sync_cost(in, 1.0, 4, 1).latency_s, 0.5 * 0.020);
  // Lanes split a message's chunks, not the message: eager_bytes applies per message.
  EXPECT_DOUBLE_EQ(sync_cost(in, 1.0, 4, 8).rtts_per_round, 0.5);
  in = parse(head + "link: {rtt_ms: 20, rate_gbps: 10, rtts_per_round: 3}\n");
  EXPECT_DOUBLE_EQ(sync_cost(in, 1.0, 4, 1).rtts_per_round, 3.0);
  // Bad input names the key.
  try {
    parse(head + "link: {rtt_ms: 20, rate_gbps: 10, eager_bytes: lots}\n");
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("link.eager_bytes"), std::string::npos) << e.what();
  }
}

TEST(Budget, HashCheckAndLocalWorkAddToEverySync) {
  // 1e6 values at 1 B/value over 100 Mbit/s (1.25e7 B/s): 0.08 s on the wire.
  const std::string model =
      "model: {params: 1e6}\ncompression: {bytes_per_value: 1}\nmeasured: {per_connection_gbps: 0.1}\n";
  // Defaults: a 1 MB message fits the eager size (0.5 RTT); the hash check is off the sync
  // path (verified a round later: 0); nothing local.
  auto in = parse(model + "link: {rtt_ms: 100, rate_gbps: 0.1}\nschedule: {step_time_s: 0.1, H: 25}\n");
  EXPECT_DOUBLE_EQ(in.check_rtts, 0.0);
  EXPECT_DOUBLE_EQ(in.local_sync_s, 0.0);
  auto c = sync_cost(in, 1.0, 1, 1);
  EXPECT_DOUBLE_EQ(c.bandwidth_s, 0.08);
  EXPECT_DOUBLE_EQ(c.check_s, 0.0);
  EXPECT_DOUBLE_EQ(c.latency_s, 0.05);
  EXPECT_DOUBLE_EQ(c.total_s, 0.08 + 0.05);
  // Without eager messages the rendezvous costs 1.5 RTT; a waiting check (check_rtts 0.5) one
  // more half.
  in = parse(model +
             "link: {rtt_ms: 100, rate_gbps: 0.1, eager_bytes: 0, check_rtts: 0.5}\n"
             "schedule: {step_time_s: 0.1, H: 25}\n");
  EXPECT_DOUBLE_EQ(sync_cost(in, 1.0, 1, 1).check_s, 0.05);
  EXPECT_DOUBLE_EQ(sync_cost(in, 1.0, 1, 1).latency_s, 0.15 + 0.05);

  // geoloco's link emulator (transport.emulate) delays only the data, one way: 0.5 RTT per
  // round; here with a waiting check (0.5), one RTT per sync. Local work 0.04 s per full
  // sync, / fragments.
  in = parse(model +
             "link: {rtt_ms: 100, rate_gbps: 0.1, rtts_per_round: 0.5, check_rtts: 0.5}\n"
             "schedule: {step_time_s: 0.1, H: 25, fragments: 2, overlap_steps: 1, local_sync_s: 0.04}\n");
  c = sync_cost(in, 1.0, 2, 1);
  EXPECT_DOUBLE_EQ(c.bandwidth_s, 0.04);
  EXPECT_DOUBLE_EQ(c.latency_s, 0.05 + 0.05);
  EXPECT_DOUBLE_EQ(c.local_s, 0.02);
  EXPECT_DOUBLE_EQ(c.total_s, 0.04 + 0.1 + 0.02);
  // Each fragment overruns its 1-step window by 0.06 s: 0.12 s exposed per 2.5 s.
  auto e = evaluate(in, 25, 8, 1.0, 2, 1);
  EXPECT_NEAR(e.exposed_s, 2 * (0.16 - 0.1), 1e-15);
  EXPECT_NEAR(e.utilization, 2.5 / (2.5 + 0.12), 1e-15);

  // The check can be switched off; local work is priced per fragment count.
  in = parse(model +
             "link: {rtt_ms: 100, rate_gbps: 0.1, check_rtts: 0}\nschedule: {step_time_s: 0.1, local_sync_s: 1}\n");
  EXPECT_DOUBLE_EQ(sync_cost(in, 1.0, 1, 1).latency_s, 0.05);
  EXPECT_DOUBLE_EQ(sync_cost(in, 1.0, 4, 1).local_s, 0.25);

  // Per-step DDP across sites neither checks hashes nor runs the codec.
  auto r = plan_budget(in);
  BudgetInput dp = in;
  dp.pattern = Pattern::Ring;
  dp.bytes_per_value_override = in.dp_bytes_per_value;
  dp.local_sync_s = 0;
  dp.check_rtts = 0;
  EXPECT_DOUBLE_EQ(r.dp_step_comm_s, sync_cost(dp, in.dp_bytes_per_value, 1, in.lanes).total_s);
  EXPECT_GT(r.full_sync.local_s, 0.0);

  // Both are validated.
  auto msg = error_of(std::string(kHeader) + model +
                      "link: {rtt_ms: 1, rate_gbps: 1}\nschedule: {step_time_s: 0.1, local_sync_s: -1}\n");
  EXPECT_NE(msg.find("schedule.local_sync_s"), std::string::npos) << msg;
  msg = error_of(std::string(kHeader) + model +
                 "link: {rtt_ms: 1, rate_gbps: 1, check_rtts: -0.5}\nschedule: {step_time_s: 0.1}\n");
  EXPECT_NE(msg.find("link.check_rtts"), std::string::npos) << msg;
}

TEST(Budget, OverlapModel) {
  // No overlap, one fragment: the whole sync is exposed.
  EXPECT_DOUBLE_EQ(exposed_wait_s(100, 1.0, 1, 0, 10.0), 10.0);
  EXPECT_DOUBLE_EQ(utilization(100, 1.0, 10.0), 100.0 / 110.0);
  // Overlap longer than the sync hides it.
  EXPECT_DOUBLE_EQ(exposed_wait_s(100, 1.0, 1, 20, 10.0), 0.0);
  EXPECT_DOUBLE_EQ(utilization(100, 1.0, 0.0), 1.0);
  // Partly hidden.
  EXPECT_DOUBLE_EQ(exposed_wait_s(100, 1.0, 1, 20, 30.0), 10.0);
  // Four fragments, each 3 s over its 5-step window.
  EXPECT_DOUBLE_EQ(exposed_wait_s(100, 1.0, 4, 5, 8.0), 12.0);
  // Eight fragments of 15 s need 120 s of link per 100 s of compute: the queue (20 s)
  // exceeds the per-fragment excess (8 x 1 s).
  EXPECT_DOUBLE_EQ(exposed_wait_s(100, 1.0, 8, 14, 15.0), 20.0);
}

TEST(Budget, SmallestHFromTheClosedForm) {
  // Sync of 2e9 bytes at 1 GB/s, no latency, no overlap: u = H / (H + 2) >= 0.95 <=> H >= 38.
  const std::string base = R"(
model: {params: 1e9}
compression: {bits: 16}
link: {rtt_ms: 1, rate_gbps: 8, rtts_per_round: 0, check_rtts: 0}
measured: {per_connection_gbps: 100}
schedule: {step_time_s: 1.0, H: 100}
)";
  auto in = parse(base + "target: {utilization: 0.95, bits: [16], fragments: [1], lanes: [1]}\n");
  auto s = smallest_h(in);
  ASSERT_TRUE(s.found) << s.reason;
  EXPECT_EQ(s.best.H, 38);
  EXPECT_DOUBLE_EQ(s.best.utilization, 38.0 / 40.0);
  // The quality floor binds from below.
  in = parse(base + "target: {utilization: 0.95, h_floor: 50, bits: [16], fragments: [1], lanes: [1]}\n");
  EXPECT_EQ(smallest_h(in).best.H, 50);
  // Unreachable below h_max: reported, with the best reached.
  in = parse(base + "target: {utilization: 0.95, h_max: 30, h_floor: 25, bits: [16], fragments: [1], lanes: [1]}\n");
  s = smallest_h(in);
  EXPECT_FALSE(s.found);
  EXPECT_EQ(s.best.H, 30);
  EXPECT_NE(s.reason.find("not reachable with H <= 30"), std::string::npos) << s.reason;
}

TEST(Budget, SmallestHPrefersPrecisionOnlyWhenItCostsNoSteps) {
  // 16 bits needs H >= 38; 8 bits (1.03125 B/value, 1.03 s sync) needs H >= 19.6, so the
  // floor 25 is reachable only with 8 bits.
  auto in = parse(R"(
model: {params: 1e9}
compression: {bits: 16}
link: {rtt_ms: 1, rate_gbps: 8, rtts_per_round: 0, check_rtts: 0}
measured: {per_connection_gbps: 100}
schedule: {step_time_s: 1.0}
target: {utilization: 0.95, h_floor: 25, bits: [16, 8, 4], fragments: [1], lanes: [1]}
)");
  auto s = smallest_h(in);
  ASSERT_TRUE(s.found);
  EXPECT_EQ(s.best.H, 25);
  EXPECT_EQ(s.best.bits, 8);
}

TEST(Budget, SmallestHKeepsTheAnswerWhenALaterConfigurationFallsShort) {
  // Blocking, latency-bound: F = 1 reaches 0.9 at some H <= h_max, F = 4 pays the latency four
  // times and cannot reach it at h_max. The answer must stay F = 1 (a regression: the first
  // configuration that fell short at h_max overwrote an answer already found).
  auto in = parse(R"(
model: {params: 5e4}
compression: {bits: 16}
link: {rtt_ms: 3, rate_gbps: 5, check_rtts: 0.5}
schedule: {step_time_s: 0.001}
target: {utilization: 0.9, h_floor: 5, h_max: 60, bits: [16], fragments: [1, 4], lanes: [1]}
)");
  auto s = smallest_h(in);
  ASSERT_TRUE(s.found) << s.reason;
  EXPECT_EQ(s.best.fragments, 1);
  EXPECT_GE(s.best.utilization, 0.9);
  EXPECT_LT(evaluate(in, 60, 16, in.bytes_per_value_for_bits(16), 4, 1).utilization, 0.9);
}

TEST(Budget, SmallestHAddsLanesWhenBandwidthDelayBound) {
  // One connection carries 1 Gbit/s (measured), the link 8 Gbit/s: lanes l give
  // min(1e9, l x 125e6) B/s. 2e9 bytes: 8 lanes -> 2 s -> H 38; 4 lanes -> 4 s -> H 76.
  auto in = parse(R"(
model: {params: 1e9}
compression: {bits: 16}
link: {rtt_ms: 8, rate_gbps: 8, rtts_per_round: 0, check_rtts: 0}
measured: {per_connection_gbps: 1}
schedule: {step_time_s: 1.0}
target: {utilization: 0.95, bits: [16], fragments: [1], lanes: [1, 2, 4, 8, 16]}
)");
  auto s = smallest_h(in);
  ASSERT_TRUE(s.found);
  EXPECT_EQ(s.best.H, 38);
  EXPECT_EQ(s.best.lanes, 8);
}

TEST(Budget, SmallestHUsesFragmentsToHideBehindOverlap) {
  // Full sync 40 s (2e10 bytes at 0.5 GB/s), overlap 10 steps of 1 s.
  // F=1: 30 s exposed -> H >= 570. F=2: 2 x 10 s -> H >= 380. F=4: hidden while the link
  // keeps up (H >= 40), below that the queue 40 - H is exposed: u = H / 40 >= 0.95 -> H = 38.
  auto in = parse(R"(
model: {params: 1e10}
compression: {bits: 16}
link: {rtt_ms: 1, rate_gbps: 4, rtts_per_round: 0, check_rtts: 0}
measured: {per_connection_gbps: 100}
schedule: {step_time_s: 1.0, overlap_steps: 10, H: 100}
target: {utilization: 0.95, bits: [16], fragments: [1, 2, 4, 8], lanes: [1]}
)");
  EXPECT_DOUBLE_EQ(evaluate(in, 570, 16, 2.0, 1, 1).utilization, 570.0 / 600.0);
  EXPECT_DOUBLE_EQ(evaluate(in, 380, 16, 2.0, 2, 1).utilization, 380.0 / 400.0);
  auto s = smallest_h(in);
  ASSERT_TRUE(s.found);
  EXPECT_EQ(s.best.H, 38);
  EXPECT_EQ(s.best.fragments, 4);
  EXPECT_DOUBLE_EQ(s.best.utilization, 38.0 / 40.0);
}

TEST(Budget, WanBytesVersusPerStepDataParallelism) {
  auto in = parse(R"(
model: {params: 1e9}
compression: {bits: 4, block: 128, scale_bytes: 4}
sites: 4
link: {rtt_ms: 40, rate_gbps: 10}
schedule: {step_time_s: 0.5, H: 100, ranks: 2}
)");
  auto r = plan_budget(in);
  // DDP: 100 steps x 2(S-1)/S x 1e9 x 2 bytes = 3e11; geoloco: 3 peers x 0.53125e9.
  EXPECT_DOUBLE_EQ(r.dp_bytes_per_period, 3e11);
  EXPECT_DOUBLE_EQ(r.geoloco_bytes_per_period, 3 * 0.53125e9);
  EXPECT_LT(r.dp_utilization, r.current.utilization);
}

TEST(Budget, SlowStartAddsRampRounds) {
  auto in = parse(R"(
model: {params: 1e6}
compression: {bits: 32}
link: {rtt_ms: 100, rate_gbps: 8, slow_start: true, initial_window_bytes: 10000}
measured: {per_connection_gbps: 0.008}
schedule: {step_time_s: 1.0}
)");
  // One connection at 1e6 B/s, 4e6 bytes: 4 ramp rounds (1.5e5 bytes, 0.4 s), then 3.85 s,
  // versus 4 s steady: 0.25 s extra.
  auto c = sync_cost(in, 4.0, 1, 1);
  EXPECT_DOUBLE_EQ(c.bandwidth_s, 4.0);
  EXPECT_NEAR(c.slow_start_s, 0.25, 1e-12);  // difference of two sums of binary fractions
}

TEST(Budget, MeasuredSectionOverridesEstimates) {
  auto in = parse(R"(
model: {params: 1e9}
link: {distance_km: 1000, rate_gbps: 10}
measured:
  rtt_ms: {median: 40.5, p99: 40.7}
  per_connection_gbps: 0.63
  connections: 8
  connections_gbps: 4.9
  step_time_s: 0.12
schedule: {step_time_s: 1.0}
)");
  EXPECT_DOUBLE_EQ(in.rtt_s, 0.0405);
  EXPECT_DOUBLE_EQ(in.rtt_p99_s, 0.0407);
  EXPECT_DOUBLE_EQ(in.step_time_s, 0.12);
  EXPECT_DOUBLE_EQ(in.per_connection_cap_Bps(), 0.63e9 / 8);
  // 8 x 0.63 = 5.04 Gbit/s; 4.9 is not below 0.9 x that, so connections were the limit and
  // the path keeps its 10 Gbit/s capacity.
  EXPECT_DOUBLE_EQ(in.site_capacity_Bps(), 1.25e9);
  in = parse(R"(
model: {params: 1e9}
link: {rtt_ms: 40, rate_gbps: 10}
measured: {per_connection_gbps: 0.63, connections: 16, connections_gbps: 2.0}
schedule: {step_time_s: 1.0}
)");
  EXPECT_DOUBLE_EQ(in.site_capacity_Bps(), 0.25e9);  // the path itself stopped at 2 Gbit/s
}

TEST(Budget, ModelFromATrainingConfigSection) {
  auto in = parse(R"(
model: {n_layer: 12, n_head: 12, n_embd: 768, block_size: 1024, vocab_size: 50257}
link: {rtt_ms: 10, rate_gbps: 10}
schedule: {step_time_s: 1.0}
)");
  EXPECT_DOUBLE_EQ(in.params, 124439808);  // GPT-2 small
}

TEST(Budget, BadInputsNameTheKey) {
  const std::string h = kHeader;
  EXPECT_EQ(error_of(h + "model: {params: 1e9}\nlink: {distance_km: -5, rate_gbps: 1}\nschedule: {step_time_s: 1}\n"),
            "budget.yaml:4:21: link.distance_km: got '-5', expected a number in [0, 1000000]");
  EXPECT_EQ(error_of("model: {params: 1e9}\n"), "budget.yaml:1:1: format: got null, expected 'geoloco-budget'");
  EXPECT_EQ(error_of("format: geoloco-budget\nversion: 2\n"),
            "budget.yaml:2:10: version: budget file version 2 is not supported (this build reads 1)");
  auto msg = error_of(h + "model: {params: 1e9\nlink: [\n");
  EXPECT_NE(msg.find("budget.yaml:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("YAML syntax error"), std::string::npos) << msg;
  msg = error_of(
      h + "model: {params: 1e9}\nlink: {rtt_ms: 5, distance_km: 100, rate_gbps: 1}\nschedule: {step_time_s: 1}\n");
  EXPECT_NE(msg.find("give distance_km or rtt_ms, not both"), std::string::npos) << msg;
  msg = error_of(h + "model: {params: lots}\nlink: {rtt_ms: 5, rate_gbps: 1}\nschedule: {step_time_s: 1}\n");
  EXPECT_NE(msg.find("model.params: got 'lots'"), std::string::npos) << msg;
  msg = error_of(h + "model: {params: 1e9}\nlink: {rtt_ms: 5, rate_gbps: 1}\nschedule: {step_tim_s: 1}\n");
  EXPECT_NE(msg.find("unknown key (did you mean 'step_time_s'?)"), std::string::npos) << msg;
  msg = error_of(h + "model: {params: 1e9}\nlink: {rate_gbps: 1}\nschedule: {step_time_s: 1}\n");
  EXPECT_NE(msg.find("no round trip"), std::string::npos) << msg;
  msg = error_of(
      h +
      "model: {params: 1e9}\ncompression: {bits: 3}\nlink: {rtt_ms: 5, rate_gbps: 1}\nschedule: {step_time_s: 1}\n");
  EXPECT_NE(msg.find("compression.bits: got '3', expected one of 32 | 16 | 8 | 4 | 2 | 1"), std::string::npos) << msg;
  msg = error_of(
      h +
      "model: {params: 1e9}\nlink: {rtt_ms: 5, rate_gbps: 1}\nschedule: {step_time_s: 1, H: 10, overlap_steps: 20}\n");
  EXPECT_NE(msg.find("overlap_steps (20) exceeds H (10)"), std::string::npos) << msg;
}

// `geoloco budget --bytes-per-value 2`: the report says what was asked. A given
// bytes_per_value replaces bits/block/scale, so bits is null (not the default 4 it never
// used) and the JSON says the byte count was given; with --bits the bits are priced.
TEST(Budget, GivenBytesPerValueIsReportedAsGivenWithoutBits) {
  BudgetFlags f;
  f.params = "1T";
  f.sites = "2";
  f.km = "100";
  f.rate_gbps = "800";
  f.step_time = "1";
  f.ranks = "64";
  f.bytes_per_value = "2";
  f.json = true;
  auto j = nlohmann::json::parse(run_budget(f));
  EXPECT_TRUE(j["inputs"]["bits"].is_null()) << j["inputs"];
  EXPECT_EQ(j["inputs"]["bytes_per_value"], 2.0);
  EXPECT_EQ(j["inputs"]["bytes_per_value_given"], true);
  EXPECT_TRUE(j["current"]["bits"].is_null()) << j["current"];
  EXPECT_EQ(j["current"]["bytes_per_value"], 2.0);
  // 1T values x 2 bytes over 800 Gbit/s: the given byte count is what is priced.
  EXPECT_NEAR(j["full_sync"]["bandwidth_s"].get<double>(), 1e12 * 2 * 8 / 800e9, 1e-9);
  // --bits next to --bytes-per-value: still overridden, still null.
  f.bits = "8";
  j = nlohmann::json::parse(run_budget(f));
  EXPECT_TRUE(j["inputs"]["bits"].is_null());
  EXPECT_TRUE(j["current"]["bits"].is_null());
  f.json = false;
  const std::string text = run_budget(f);
  EXPECT_NE(text.find("2 bytes/value (given; bits, block and scale do not apply)"), std::string::npos) << text;
  EXPECT_EQ(text.find("8 bits, block"), std::string::npos) << text;
  // Without the override: bits as asked, priced from them.
  f.bytes_per_value.clear();
  f.bits = "16";
  f.json = true;
  j = nlohmann::json::parse(run_budget(f));
  EXPECT_EQ(j["inputs"]["bits"], 16);
  EXPECT_EQ(j["inputs"]["bytes_per_value_given"], false);
  EXPECT_EQ(j["current"]["bits"], 16);
  EXPECT_EQ(j["inputs"]["bytes_per_value"], 2.0);
}

TEST(Budget, ShippedExampleFilesParseAndPlan) {
  namespace fs = std::filesystem;
  int n = 0;
  for (const auto& e : fs::directory_iterator(fs::path(GEOLOCO_SOURCE_DIR) / "configs/links")) {
    if (e.path().filename().string().rfind("budget", 0) != 0) continue;
    SCOPED_TRACE(e.path().string());
    auto doc = geoloco::config::load_file(e.path().string());
    auto r = plan_budget(BudgetInput::from_yaml(doc.node()));
    EXPECT_GT(r.current.utilization, 0.0);
    EXPECT_FALSE(format_budget_table(r).empty());
    EXPECT_EQ(budget_json(r)["format"], "geoloco-budget-report");
    ++n;
  }
  EXPECT_GE(n, 2);
}

TEST(Budget, MeasuredSectionRoundTripsBitExact) {
  MeasuredPath m;
  m.rtt_median_ms = 40.512345678901234;
  m.rtt_p99_ms = 41.0000000001;
  m.per_connection_gbps = 0.6291456;
  m.connections = 8;
  m.connections_gbps = 1.0 / 3.0;
  m.step_time_s = 0.1 + 0.2;  // not representable in short decimal
  m.retransmit_pct = 0.0123456789;
  const std::string text = std::string("model: {params: 1e9}\nlink: {rate_gbps: 10}\n") + measured_yaml(m);
  auto in = parse(text);
  EXPECT_EQ(in.rtt_s, m.rtt_median_ms * 1e-3);
  EXPECT_EQ(in.rtt_p99_s, m.rtt_p99_ms * 1e-3);
  EXPECT_EQ(*in.measured_per_connection_Bps, gbit_to_bytes_per_s(m.per_connection_gbps));
  EXPECT_EQ(in.measured_connections, 8);
  EXPECT_EQ(*in.measured_path_Bps, gbit_to_bytes_per_s(1.0 / 3.0));
  EXPECT_EQ(in.step_time_s, 0.1 + 0.2);
  ASSERT_TRUE(in.measured_retransmit_pct.has_value());
  EXPECT_EQ(*in.measured_retransmit_pct, 0.0123456789);
  // 0% retransmissions is a measurement too: written, read back as 0.
  MeasuredPath none;
  none.retransmit_pct = 0.0;
  EXPECT_EQ(measured_yaml(none), "measured:\n  retransmit_pct: 0\n");
  // Nothing measured: an empty section, still a valid document once the rest is given.
  EXPECT_EQ(measured_yaml(MeasuredPath{}), "measured: {}\n");
}

// Overlapped outer syncs (outer.overlap_steps, outer.delayed_update), the compute
// utilization / exposed-wait metrics and trace.json. Ranks run as threads in this process
// (UCX over loopback between sites, Gloo inside a site).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "tests/trainer/loop/test_util.hpp"
#include "tests/support/ports.hpp"
#include "multisite_util.hpp"
#include "outer_optimizer/outer_config.hpp"
#include "trainer/app/rank_runner.hpp"
#include "core/config_node.hpp"
#include "core/error.hpp"
#include "trainer/loop/run_config.hpp"

using namespace geoloco;
using geoloco::test::fresh_port;
using geoloco::test::TempDir;

namespace {

std::string base(const std::filesystem::path& out, int steps,
                 const std::string& model = "n_layer: 2, n_head: 2, n_embd: 32", int micro_batch = 4) {
  return "run: {name: ov, seed: 3, output_dir: " + out.string() +
         "}\n"
         "model: {" +
         model +
         ", block_size: 16, vocab_size: 32}\n"
         "data:\n  train: {kind: synthetic, vocab: 32, branching: 3, seed: 5, tokens: 400000}\n"
         "train: {steps: " +
         std::to_string(steps) + ", micro_batch: " + std::to_string(micro_batch) +
         ", log_every: 5, optimizer: {lr: 3.0e-3}}\n";
}

std::string sites(int count, int ranks) { return geoloco::testing::sites_yaml(count, ranks, fresh_port()); }

std::string tport(const std::string& extra = "") {
  return "transport: {psk_file: k.psk, timeout_s: 30" + extra + "}\n";
}

// Global rank 0's run summary.
nlohmann::json run_all(const trainer::RunConfig& cfg, int64_t stop_at = 0, bool resume = false) {
  return geoloco::testing::run_ranks(cfg, stop_at, resume)[0];
}

trainer::RunConfig load(TempDir& d, const std::string& yaml) {
  d.file("k.psk", "0123456789abcdef-test-key");
  return trainer::load_run_config(d.file("c.yaml", yaml));
}

std::set<std::string> distinct(const nlohmann::json& summary, const char* key) {
  std::set<std::string> v;
  for (auto& r : summary["ranks"]) v.insert(r[key].get<std::string>());
  return v;
}

outer::OuterConfig outer_from(const std::string& yaml) {
  auto doc = config::load_string(yaml, "o.yaml");
  return outer::OuterConfig::from_yaml(doc.node().child("outer"));
}

}  // namespace

TEST(OverlapConfig, DefaultsAndRejections) {
  auto c = outer_from("outer: {interval: 10}\n");
  EXPECT_EQ(c.overlap_steps, 0);
  EXPECT_EQ(c.merge_alpha, 0.5);
  EXPECT_FALSE(c.delayed_update);
  auto t = outer_from("outer: {interval: 10, overlap_steps: 9, merge_alpha: 0.25}\n");
  EXPECT_EQ(t.overlap_steps, 9);
  EXPECT_EQ(t.merge_alpha, 0.25);
  EXPECT_THROW(outer_from("outer: {interval: 10, overlap_steps: 10}\n"), ConfigError);
  EXPECT_THROW(outer_from("outer: {interval: 10, overlap_steps: -1}\n"), ConfigError);
  EXPECT_THROW(outer_from("outer: {interval: 10, merge_alpha: 1.5}\n"), ConfigError);
  EXPECT_THROW(outer_from("outer: {interval: 10, delayed_update: true, overlap_steps: 2}\n"), ConfigError);
  EXPECT_TRUE(outer_from("outer: {interval: 10, delayed_update: true}\n").delayed_update);
}

// Utilization, exposed wait and the trace of a plain (blocking) 2-site run.
TEST(OverlapMetrics, UtilizationWaitAndTraceWritten) {
  TempDir d;
  auto cfg =
      load(d, base(d.path() / "out", 8) + "outer: {interval: 4, compression: {codec: int8}}\n" + sites(2, 1) + tport());
  auto s = run_all(cfg);
  ASSERT_EQ(s["ranks"].size(), 2u);
  for (auto& r : s["ranks"]) {
    const double u = r["compute_utilization"].get<double>();
    EXPECT_GT(u, 0.0);
    EXPECT_LE(u, 1.0);
    // Exposed wait: the two blocking syncs, at least as long as their measured sync time.
    double sync_sum = 0;
    for (auto& x : r["sync_seconds"]) sync_sum += x.get<double>();
    EXPECT_GE(r["exposed_wait_s"].get<double>(), sync_sum);
    EXPECT_NEAR(u, r["compute_s"].get<double>() / r["wall_s"].get<double>(), 1e-12);
    EXPECT_EQ(r["trace_events_dropped"].get<int>(), 0);
  }
  // Each outer step's metrics line carries the period's utilization and wait.
  std::ifstream in(d.path() / "out" / "metrics.jsonl");
  std::string line;
  int periods = 0;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    if (!j.contains("compute_utilization")) continue;
    ++periods;
    EXPECT_GT(j["compute_utilization"].get<double>(), 0.0);
    EXPECT_LE(j["compute_utilization"].get<double>(), 1.0);
    EXPECT_GT(j["exposed_wait_s"].get<double>(), 0.0);
    EXPECT_TRUE(j["step"] == 4 || j["step"] == 8) << line;
  }
  EXPECT_EQ(periods, 2);
  // trace.json: a trace-event array with both ranks and every phase.
  auto trace = nlohmann::json::parse(std::ifstream(d.path() / "out" / "trace.json"));
  ASSERT_TRUE(trace.is_array());
  std::map<int, std::set<std::string>> names;
  std::map<std::string, int> count0;
  for (auto& e : trace) {
    if (e["ph"] != "X") continue;
    EXPECT_GE(e["dur"].get<int64_t>(), 0);
    names[e["pid"].get<int>()].insert(e["name"].get<std::string>());
    if (e["pid"] == 0) ++count0[e["name"].get<std::string>()];
  }
  ASSERT_EQ(names.size(), 2u);
  for (auto& [pid, set] : names)
    for (const char* n : {"forward", "backward", "optimizer", "compress", "send", "receive", "decode",
                          "outer_optimizer", "outer_step", "wait"})
      EXPECT_TRUE(set.count(n)) << "rank " << pid << " lacks span " << n;
  EXPECT_EQ(count0["forward"], 8);  // one per micro-batch: 8 steps x grad_accum 1
  EXPECT_EQ(count0["compress"], 2);
  EXPECT_TRUE(std::filesystem::exists(d.path() / "out" / "sites" / "lyon" / "trace.r0.json"));
}

// overlap_steps 0 (explicit, with a merge_alpha that would change the result if it were
// used) is the plain outer loop, bit for bit.
TEST(Overlap, Tau0EqualsPlainOuterLoop) {
  TempDir a, b;
  const std::string tail = sites(2, 2) + tport();
  auto plain = run_all(load(a, base(a.path() / "out", 10) +
                                   "outer: {interval: 4, compression: {codec: int8, error_feedback: true}}\n" + tail));
  auto zero = run_all(load(b, base(b.path() / "out", 10) +
                                  "outer: {interval: 4, overlap_steps: 0, merge_alpha: 0.3, delayed_update: false, "
                                  "compression: {codec: int8, error_feedback: true}}\n" +
                                  sites(2, 2) + tport()));
  EXPECT_EQ(plain["params_hash"], zero["params_hash"]);
  EXPECT_EQ(plain["global_weights_hash"], zero["global_weights_hash"]);
  EXPECT_EQ(zero["outer_steps"].get<int>(), 3);
}

// With overlap on, every site computes the same global weights each round (the hash check
// runs every round) and the run ends with identical replicas; the result differs from the
// blocking run (the overlap is real).
TEST(Overlap, SitesStayBitIdentical) {
  std::string plain_hash;
  {
    TempDir d;
    plain_hash = run_all(load(d, base(d.path() / "out", 14) + "outer: {interval: 4, compression: {codec: int8}}\n" +
                                     sites(2, 2) + tport()))["params_hash"];
  }
  for (const char* mode : {"overlap_steps: 2", "overlap_steps: 3, merge_alpha: 0.0", "delayed_update: true"}) {
    TempDir d;
    auto s = run_all(load(d, base(d.path() / "out", 14) + "outer: {interval: 4, " + mode +
                                 ", compression: {codec: int4, block: 64, error_feedback: true}}\n" + sites(2, 2) +
                                 tport()));
    EXPECT_EQ(distinct(s, "params_hash").size(), 1u) << mode;
    EXPECT_EQ(distinct(s, "global_weights_hash").size(), 1u) << mode;
    // Launches at 4, 8, 12, then the blocking sync at the last step.
    EXPECT_EQ(s["outer_steps"].get<int>(), 4) << mode;
    EXPECT_NE(s["params_hash"], plain_hash) << mode;
  }
}

// A checkpoint taken while a sync is in flight (stop at 6: launched at 4, merge due at 7)
// resumes bit-identically to the uninterrupted run.
TEST(Overlap, ResumeWithSyncInFlightIsExact) {
  TempDir a, b;
  const std::string body = "outer: {interval: 4, overlap_steps: 3, compression: {codec: int8, error_feedback: true}}\n";
  auto ref = run_all(load(a, base(a.path() / "out", 12) + body + sites(2, 1) + tport()));
  auto cfg = load(b, base(b.path() / "out", 12) + body + sites(2, 1) + tport());
  run_all(cfg, 6);
  auto res = run_all(cfg, 0, true);
  EXPECT_EQ(res["params_hash"], ref["params_hash"]);
  EXPECT_EQ(res["global_weights_hash"], ref["global_weights_hash"]);
}

// 200 ms added to every cross-site transfer: blocking syncs expose it, overlapped ones hide
// it behind tau steps of compute. Compared on the steady-state outer period (metrics.jsonl,
// the period ending at the second sync/merge; the run's last step always syncs blocking,
// so the whole-run figure includes one exposed sync). Every check is relative -- to the
// emulated delay, or to the blocking run measured in the same test -- so it holds whatever
// this machine's step time; the absolute utilization (the target, >= 95% overlapped)
// is bench/overlap's figure (docs/overlap.md).
TEST(Overlap, HidesTwoHundredMsDelay) {
  struct Result {
    double period_util = -1, period_wait = -1, period_wall = -1;
    int hash_checks = 0, long_hash_checks = 0;  // trace.json, every rank; long: >= 0.1 s
    double max_receive_s = -1;
    nlohmann::json summary;
  };
  auto run = [](const std::string& outer, int64_t period_end) {
    TempDir d;
    auto cfg =
        load(d, base(d.path() / "out", 60, "n_layer: 4, n_head: 4, n_embd: 128", 32) + "outer: {interval: 20" + outer +
                    ", compression: {codec: int8}}\n" + sites(2, 1) + tport(", emulate: {delay_ms: 200}"));
    Result r;
    r.summary = run_all(cfg);
    std::ifstream in(d.path() / "out" / "metrics.jsonl");
    std::string line;
    while (std::getline(in, line)) {
      auto j = nlohmann::json::parse(line);
      if (j["step"] == period_end && j.contains("compute_utilization")) {
        r.period_util = j["compute_utilization"].get<double>();
        r.period_wait = j["exposed_wait_s"].get<double>();
        r.period_wall = j["period_wall_s"].get<double>();
      }
    }
    for (auto& e : nlohmann::json::parse(std::ifstream(d.path() / "out" / "trace.json"))) {
      if (e["ph"] != "X") continue;
      const double secs = e["dur"].get<double>() / 1e6;
      if (e["name"] == "hash_check") {
        ++r.hash_checks;
        r.long_hash_checks += secs >= 0.1;
      }
      if (e["name"] == "receive") r.max_receive_s = std::max(r.max_receive_s, secs);
    }
    return r;
  };
  auto b = run("", 40);                                        // syncs at 20, 40, 60
  auto o = run(", overlap_steps: 19, check_hash: false", 59);  // merges at 39, 59; sync at 60
  std::printf(
      "compute utilization, 2 sites, +200 ms per transfer, steady-state period: blocking %.4f (exposed wait "
      "%.3f s of %.3f s), overlapped tau=19 %.4f (exposed wait %.3f s of %.3f s); whole run: blocking %.4f, "
      "overlapped %.4f\n",
      b.period_util, b.period_wait, b.period_wall, o.period_util, o.period_wait, o.period_wall,
      b.summary["compute_utilization"].get<double>(), o.summary["compute_utilization"].get<double>());
  ASSERT_GE(b.period_util, 0.0);
  ASSERT_GE(o.period_util, 0.0);
  ASSERT_GT(b.period_wall, 0.0);
  // Overlap hides what blocking exposes. Compared as exposed seconds first: a fixed 200 ms
  // costs more utilization on a faster machine (on a slower host blocking reached 0.93 with
  // overlap at 0.999), but the seconds it exposes do not depend on the step time.
  EXPECT_LT(o.period_wait, 0.25 * b.period_wait);
  // Then as utilization: blocking loses its exposed share of the period (wait / wall, the wait
  // at least the 200 ms delay: asserted below), and overlap must win back at least half of that
  // share. Both sides are measured here, so the margin follows this machine's step time. (With
  // overlap turned off the second run still came out 0.03-0.06 above the first: half of
  // 0.2 s / wall did not catch that, half the exposed share does.)
  EXPECT_GE(o.period_util - b.period_util, 0.5 * b.period_wait / b.period_wall)
      << "blocking exposed " << b.period_wait << " s of " << b.period_wall << " s";
  // Blocking pays the pseudo-gradient's 200 ms. The weights-hash check of a round is verified
  // at the next round, when the peers' hashes arrived long ago: only the run's final check
  // (after the last sync) may wait for the 200 ms delay, one per rank, where every round's
  // check used to (3 syncs x 2 ranks). Receives do wait. (Counts, not a bound on the period:
  // site skew inflates periods on a loaded machine.)
  EXPECT_GE(b.period_wait, 0.2);
  EXPECT_GE(b.max_receive_s, 0.19);
  EXPECT_GE(b.hash_checks, 6);
  EXPECT_LE(b.long_hash_checks, 2);
}

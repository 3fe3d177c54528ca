// The outer loop as a library: Diloco constructed directly over the in-memory fabric, each
// site's rank a thread driving it with a test-double site (fake_site.hpp) -- no trainer, no
// run config, no CLI (this executable links neither the inner loop nor the app). Rounds run
// with every site, with a site lost and evicted, with that site rejoining from the others, and
// across a re-plan.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <exception>
#include <thread>

#include "outer_optimizer/diloco.hpp"
#include "tests/outer_optimizer/fake_site.hpp"
#include "tests/support/threads.hpp"
#include "tests/transport/test_util.hpp"
#include "transport/memory/memory_fabric.hpp"

using namespace geoloco;
using geoloco::testing::FakeSite;

namespace {

const char* kNames[] = {"paris", "lyon", "milan"};

outer::OuterOptions options(int sites, int site, int64_t steps, outer::OuterConfig oc) {
  outer::OuterOptions o;
  for (int s = 0; s < sites; ++s) o.sites.push_back({kNames[s], 1});
  o.site = site;
  o.rank = 0;
  o.outer = std::move(oc);
  o.outer.enabled = true;
  o.params = geoloco::testing::toy_model();
  o.total_steps = steps;
  o.tokens_per_step = 1000;
  o.config_hash = 0xC0FFEE;
  return o;
}

// A transport for `site` on the fabric, connected to the other sites' rank 0.
std::unique_ptr<transport::memory::MemoryTransport> connect(transport::memory::MemoryFabric& fabric, int sites,
                                                            int site, transport::ConnectMode mode) {
  auto tc = transport::test::small_config();
  auto t = fabric.endpoint(tc, transport::test::ident(kNames[site]));
  std::vector<transport::PeerInfo> peers;
  for (int s = 0; s < sites; ++s)
    if (s != site) peers.push_back({kNames[s], 0, "memory", s});
  t->connect(peers, mode);
  return t;
}

// What a site ends with: its weights, its outer loop's hash and summary.
struct End {
  std::vector<float> params;
  uint64_t hash = 0;
  nlohmann::json summary;
};

// Drives one site's outer loop from step `from` + 1 to the end, as an inner loop would.
End drive(outer::Diloco& d, FakeSite& site, int64_t from, int64_t steps,
          const std::function<void(int64_t)>& each = {}) {
  for (int64_t step = from + 1; step <= steps; ++step) {
    if (d.trains_step(step)) site.train(step);
    d.after_inner_step(step);
    if (step == steps) d.finish(step);
    if (each) each(step);
  }
  return {site.params(), d.site_hash(), d.summary()};
}

}  // namespace

// Three sites, plain averaging (outer SGD, lr 1, no momentum, fp32): after every round each
// site holds the average of the three sites' weights, bit-identical on all of them.
TEST(OuterLibrary, ThreeSitesEndOnTheirAverageBitForBit) {
  transport::memory::MemoryFabric fabric;
  outer::OuterConfig oc;
  oc.interval = 4;
  oc.optimizer.kind = outer::OuterOptimizerKind::Sgd;
  oc.optimizer.lr = 1.0;
  oc.optimizer.momentum = 0.0;
  oc.compression.codec = compression::Codec::kFp32;
  const int64_t steps = 8;
  auto ends = test::run_ranks(3, [&](int s) {
    auto t = connect(fabric, 3, s, transport::ConnectMode::kAll);
    FakeSite site(s, geoloco::testing::toy_init(geoloco::testing::toy_model().total));
    outer::Diloco d(options(3, s, steps, oc), t.get(), site);
    return drive(d, site, 0, steps);
  });
  // The reference: three replicas trained apart from the same start, averaged every 4 steps.
  const auto n = static_cast<size_t>(geoloco::testing::toy_model().total);
  std::vector<FakeSite> ref;
  for (int s = 0; s < 3; ++s) ref.emplace_back(s, geoloco::testing::toy_init(static_cast<int64_t>(n)));
  for (int64_t step = 1; step <= steps; ++step) {
    for (auto& r : ref) r.train(step);
    if (step % 4 == 0) {
      std::vector<float> avg(n);
      for (size_t i = 0; i < n; ++i)
        avg[i] = (double(ref[0].params()[i]) + ref[1].params()[i] + ref[2].params()[i]) / 3.0;
      for (auto& r : ref) std::copy(avg.begin(), avg.end(), r.shard_params().begin());
    }
  }
  for (int s = 0; s < 3; ++s) {
    EXPECT_EQ(ends[s].params, ends[0].params) << kNames[s];
    EXPECT_EQ(ends[s].hash, ends[0].hash) << kNames[s];
    EXPECT_EQ(ends[s].summary["outer_steps"], 2);
  }
  double worst = 0;
  for (size_t i = 0; i < n; ++i) worst = std::max(worst, std::fabs(double(ends[0].params[i]) - ref[0].params()[i]));
  EXPECT_LT(worst, 1e-6) << "the outer loop's average differs from the sites' mean";
}

// milan dies after step 12 (its process gone: its connections fail): the next round commits
// without it and evicts it; a new milan process (started once the others evicted it, as the
// launcher restarts a site after a backoff) joins the running job, fetches the committed state,
// verifies it and trains from its step; every site ends on one hash.
TEST(OuterLibrary, ALostSiteIsEvictedAndARestartedOneRejoinsVerified) {
  transport::memory::MemoryFabric fabric;
  outer::OuterConfig oc;
  oc.interval = 4;
  oc.compression.codec = compression::Codec::kInt8;
  oc.compression.error_feedback = true;
  oc.deadline_s = 10;
  oc.consensus_retry_s = 0.2;
  const int64_t steps = 200, lost_at = 12;
  std::atomic<bool> evicted{false}, joined{false};
  auto ends = test::run_ranks(3, [&](int s) {
    if (s == 2) {
      {
        auto t = connect(fabric, 3, s, transport::ConnectMode::kAll);
        FakeSite site(s, geoloco::testing::toy_init(geoloco::testing::toy_model().total));
        outer::Diloco d(options(3, s, steps, oc), t.get(), site);
        for (int64_t step = 1; step <= lost_at; ++step) {
          site.train(step);
          d.after_inner_step(step);
        }
        fabric.kill(kNames[s], 0);  // the process dies between two rounds
      }
      // Restarted once the others let it go: a new process takes its place and joins.
      const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      while (!evicted && std::chrono::steady_clock::now() < limit)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      EXPECT_TRUE(evicted) << "the survivors never evicted milan";
      auto t = connect(fabric, 3, s, transport::ConnectMode::kJoin);
      FakeSite site(s, std::vector<float>(static_cast<size_t>(geoloco::testing::toy_model().total), 0.0f));
      auto o = options(3, s, steps, oc);
      o.joining = true;
      outer::Diloco d(std::move(o), t.get(), site);
      const int64_t at = d.join();
      EXPECT_GT(at, lost_at);
      joined = true;
      return drive(d, site, at, steps);
    }
    auto t = connect(fabric, 3, s, transport::ConnectMode::kAll);
    FakeSite site(s, geoloco::testing::toy_init(geoloco::testing::toy_model().total));
    outer::Diloco d(options(3, s, steps, oc), t.get(), site);
    // The survivors train slowly until milan is back, so it finds them running.
    return drive(d, site, 0, steps, [&](int64_t) {
      if (!((d.members() >> 2) & 1) && !joined) evicted = true;
      if (!joined) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    });
  });
  ASSERT_TRUE(joined);
  for (int s = 0; s < 3; ++s) {
    EXPECT_EQ(ends[s].hash, ends[0].hash) << kNames[s];
    EXPECT_EQ(ends[s].params, ends[0].params) << kNames[s];
  }
  const auto& m = ends[0].summary["membership"];
  ASSERT_EQ(m["evictions"].size(), 1u) << m.dump();
  EXPECT_EQ(m["evictions"][0]["site"], "milan");
  EXPECT_GT(m["evictions"][0]["step"].get<int64_t>(), lost_at);
  ASSERT_EQ(m["joins"].size(), 1u) << m.dump();
  EXPECT_EQ(m["joins"][0]["site"], "milan");
  EXPECT_GT(m["joins"][0]["bytes_served"].get<uint64_t>(), 0u);
  EXPECT_EQ(m["members"], nlohmann::json({"paris", "lyon", "milan"}));
  // The joiner verified the committed state before training on it.
  const auto& own = ends[2].summary["membership"]["joined"];
  ASSERT_TRUE(own.is_object()) << ends[2].summary["membership"].dump();
  EXPECT_GT(own["step"].get<int64_t>(), lost_at);
}

// outer.plan: auto over the fabric: a start-up plan from the probe and the timed steps, then
// the link looks 200x slower (the drift hook): both sites re-plan at the same boundary to a
// longer interval, rebuild their fragments and end on one hash.
TEST(OuterLibrary, ARePlanAppliesOnEverySiteAtTheSameBoundary) {
  transport::memory::MemoryFabric fabric;
  outer::OuterConfig oc;
  oc.plan = outer::PlanKind::Auto;
  oc.plan_measure_steps = 4;
  oc.plan_probe_seconds = 0.1;
  oc.plan_h_min = 5;
  oc.plan_h_max = 150;
  oc.target_utilization = 0.9;
  oc.replan_threshold = 0.5;
  oc.plan_bits = {16};
  oc.compression.codec = compression::Codec::kFp32;
  const int64_t steps = 400;
  auto ends = test::run_ranks(2, [&](int s) {
    auto t = connect(fabric, 2, s, transport::ConnectMode::kAll);
    // A model large enough that a 200x slower link makes its syncs bandwidth-bound.
    const auto model = geoloco::testing::toy_model(4, 256, 48);
    FakeSite site(s, geoloco::testing::toy_init(model.total));
    auto o = options(2, s, steps, oc);
    o.params = model;
    o.hooks.drift = outer::OuterHooks::Drift{20, 200};
    outer::Diloco d(std::move(o), t.get(), site);
    End e = drive(d, site, 0, steps, [](int64_t) { std::this_thread::sleep_for(std::chrono::milliseconds(2)); });
    if (s == 0) EXPECT_EQ(site.plans["plans"].size(), d.plan_history().size());
    return e;
  });
  EXPECT_EQ(ends[1].hash, ends[0].hash);
  EXPECT_EQ(ends[1].params, ends[0].params);
  for (const auto& e : ends) {
    const auto& plans = e.summary["plans"];
    ASSERT_GE(plans.size(), 2u) << plans.dump();
    EXPECT_GE(e.summary["replans"].get<int>(), 1) << plans.dump();
    EXPECT_GT(plans.back()["interval"].get<int>(), plans.front()["interval"].get<int>()) << plans.dump();
    EXPECT_EQ(e.summary["outer_interval"], plans.back()["interval"]);
    EXPECT_EQ(plans, ends[0].summary["plans"]);  // the same plans, epoch for epoch
  }
}

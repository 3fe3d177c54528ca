// Shared by the outer-loop tests: every rank of a config run as a thread in this process
// (UCX over loopback between sites, Gloo inside a site), the `sites:` YAML they use, and the
// check that every rank ends on one hash.
#pragma once

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "tests/support/threads.hpp"
#include "trainer/app/rank_runner.hpp"
#include "trainer/checkpoint/model_checkpoint.hpp"
#include "trainer/loop/run_config.hpp"

namespace geoloco::testing {

// What every rank of a run_ranks() gets beyond its site and rank: outer-loop hooks, and
// how it reaches the other sites (default UCX over loopback; memory_sites.hpp gives the
// in-memory fabric's).
struct RankSetup {
  outer::OuterHooks hooks;
  app::RankOptions::ConnectTransport connect_transport;
};

// Runs every rank; returns each rank's result by global rank (global rank 0's is the run
// summary). Rethrows the lowest failing rank's exception after all threads joined.
// `per_site[s]` is the config site s's ranks see (one config for all: the overload below);
// different configs with one hash stand in for sites whose machines differ (e.g. a file).
inline std::vector<nlohmann::json> run_ranks(const std::vector<trainer::RunConfig>& per_site, int64_t stop_at = 0,
                                             bool resume = false, const RankSetup& setup = {}) {
  const trainer::RunConfig& cfg = per_site.at(0);
  std::vector<std::pair<int, int>> site_rank(static_cast<size_t>(cfg.world_size()));  // by global rank
  for (size_t s = 0; s < cfg.sites.size(); ++s)
    for (int r = 0; r < cfg.sites[s].ranks; ++r)
      site_rank[static_cast<size_t>(cfg.global_rank(static_cast<int>(s), r))] = {static_cast<int>(s), r};
  return test::run_ranks(cfg.world_size(), [&](int g) {
    const auto [s, r] = site_rank[static_cast<size_t>(g)];
    app::RankOptions o;
    o.site = s;
    o.rank = r;
    o.progress = false;
    o.stop_at_step = stop_at;
    o.resume = resume;
    o.outer_hooks = setup.hooks;
    o.connect_transport = setup.connect_transport;
    return app::run_rank(per_site.at(static_cast<size_t>(s)), o);
  });
}

inline std::vector<nlohmann::json> run_ranks(const trainer::RunConfig& cfg, int64_t stop_at = 0, bool resume = false,
                                             const RankSetup& setup = {}) {
  return run_ranks(std::vector<trainer::RunConfig>(cfg.sites.size(), cfg), stop_at, resume, setup);
}

// `count` sites of `ranks` ranks each, site i on port + 10 i, with a strategy when given.
inline std::string sites_yaml(int count, int ranks, int port, const std::string& strategy = "") {
  static const char* names[] = {"paris", "lyon", "milan", "oslo"};
  std::string s = "sites:\n";
  for (int i = 0; i < count; ++i)
    s += "  - {name: " + std::string(names[i]) + ", ranks: " + std::to_string(ranks) +
         ", port: " + std::to_string(port + 10 * i) + (strategy.empty() ? "" : ", strategy: " + strategy) + "}\n";
  return s;
}

// The parameters of a model.safetensors a run wrote (the summary's "checkpoint").
inline std::vector<float> load_params(const std::string& checkpoint) {
  auto f = geoloco::SafetensorsFile::read(checkpoint);
  auto mc = trainer::read_model_config(f);
  trainer::ParamLayout layout(mc);
  std::vector<float> p(static_cast<size_t>(layout.total()));
  trainer::load_model(f, layout, p);
  return p;
}

// A run's summary (global rank 0's): `ranks` ranks, every one of them on one global-weights
// hash and one parameter hash.
inline void expect_one_hash(const nlohmann::json& summary, size_t ranks, const std::string& what) {
  ASSERT_EQ(summary["ranks"].size(), ranks) << what;
  std::set<std::string> hashes, params;
  for (auto& r : summary["ranks"]) {
    hashes.insert(r["global_weights_hash"].get<std::string>());
    params.insert(r["params_hash"].get<std::string>());
  }
  EXPECT_EQ(hashes.size(), 1u) << what;
  EXPECT_EQ(params.size(), 1u) << what;
}

}  // namespace geoloco::testing

// Shared by the outer-loop tests: every rank of a config run as a thread in this process
// (UCX over loopback between sites, Gloo inside a site), and the `sites:` YAML they use.
#pragma once

#include <exception>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "trainer/app/rank_runner.hpp"
#include "trainer/loop/run_config.hpp"

namespace geoloco::testing {

// Runs every rank; returns each rank's result by global rank (global rank 0's is the run
// summary). Rethrows the first rank's exception after all threads joined.
// `per_site[s]` is the config site s's ranks see (one config for all: the overload below);
// different configs with one hash stand in for sites whose machines differ (e.g. a file).
inline std::vector<nlohmann::json> run_ranks(const std::vector<trainer::RunConfig>& per_site, int64_t stop_at = 0,
                                             bool resume = false) {
  const trainer::RunConfig& cfg = per_site.at(0);
  const int world = cfg.world_size();
  std::vector<nlohmann::json> out(static_cast<size_t>(world));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (size_t s = 0; s < cfg.sites.size(); ++s)
    for (int r = 0; r < cfg.sites[s].ranks; ++r) {
      const int g = cfg.global_rank(static_cast<int>(s), r);
      threads.emplace_back([&, s, r, g] {
        try {
          app::RankOptions o;
          o.site = static_cast<int>(s);
          o.rank = r;
          o.progress = false;
          o.stop_at_step = stop_at;
          o.resume = resume;
          out[static_cast<size_t>(g)] = app::run_rank(per_site.at(s), o);
        } catch (...) {
          errors[static_cast<size_t>(g)] = std::current_exception();
        }
      });
    }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  return out;
}

inline std::vector<nlohmann::json> run_ranks(const trainer::RunConfig& cfg, int64_t stop_at = 0, bool resume = false) {
  return run_ranks(std::vector<trainer::RunConfig>(cfg.sites.size(), cfg), stop_at, resume);
}

// `count` sites of `ranks` ranks each, site i on port + 10 i, with a strategy when given.
inline std::string sites_yaml(int count, int ranks, int port, const std::string& strategy = "") {
  static const char* names[] = {"paris", "lyon", "milan", "oslo"};
  std::string s = "sites:\n";
  for (int i = 0; i < count; ++i)
    s += "  - {name: " + std::string(names[i]) + ", ranks: " + std::to_string(ranks) + ", port: " +
         std::to_string(port + 10 * i) + (strategy.empty() ? "" : ", strategy: " + strategy) + "}\n";
  return s;
}

}  // namespace geoloco::testing

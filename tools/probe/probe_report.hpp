// Rendering of a probe run: a table for people, one JSON document for scripts, and the budget
// YAML (`format: geoloco-budget`) whose `measured:` section `geoloco budget --from` reads.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>

#include "planner/budget.hpp"
#include "tools/probe/probe_runner.hpp"

namespace geoloco::probe {

// What a run config adds to the budget document (config mode); absent in the standalone
// modes, where `geoloco budget` needs --params/--config and --step-time.
struct BudgetContext {
  std::string config;       // the run config's path, for the comment
  int64_t params = 0;       // model parameters
  std::optional<int> bits;  // outer.compression codec's bits (absent for top-k)
  int64_t block = 128;
  int64_t H = 0;  // outer.interval
  int64_t fragments = 1;
  int64_t overlap_steps = 0;
  int ranks = 1;  // ranks per site (the smallest site)
  int lanes = 1;  // the run's transport lanes
};

// The path the budget plans for: the worst pair (largest RTT median and p99, smallest
// single- and all-lanes throughput, largest retransmission share), since a DiLoCo sync waits
// for its slowest pair.
planner::MeasuredPath worst_path(const ProbeRun& run);

std::string format_probe_table(const ProbeRun& run);
nlohmann::json probe_json(const ProbeRun& run);
std::string budget_yaml(const ProbeRun& run, const std::optional<BudgetContext>& ctx);

}  // namespace geoloco::probe

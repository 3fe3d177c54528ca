// The run-level summary.json (written by global rank 0) and the human summary printed at
// the end of `train` / `launch`.
#pragma once

#include <nlohmann/json.hpp>
#include <vector>

#include "trainer/loop/run_config.hpp"

namespace geoloco::app {

// Merges per-rank summaries (global rank 0 first) into summary.json under run.output_dir;
// returns it.
nlohmann::json write_run_summary(const trainer::RunConfig& cfg, const std::vector<nlohmann::json>& ranks,
                                 const nlohmann::json& totals);
void print_human_summary(const trainer::RunConfig& cfg, const nlohmann::json& summary);

}  // namespace geoloco::app

// The edge between a run's config and the outer loop: the outer loop's options for one rank,
// built from the run's YAML (RunConfig) -- the one place the outer loop's inputs are read from
// it (outer_optimizer/outer_options.hpp).
#pragma once

#include "outer_optimizer/outer_options.hpp"
#include "trainer/loop/run_config.hpp"

namespace geoloco::trainer {

outer::OuterOptions outer_options(const RunConfig& cfg, int site, int rank, outer::OuterHooks hooks = {},
                                  bool joining = false);

// Every site of the run as the outer loop names them (config order).
std::vector<outer::SiteSpec> outer_sites(const RunConfig& cfg);

}  // namespace geoloco::trainer

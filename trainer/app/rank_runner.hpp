// One rank, end to end: the site's collective (Gloo rendezvous), the UCX transport to the
// same rank of every other site, the inner loop, the DiLoCo outer loop, and at the end the
// run-level summary.json gathered at global rank 0. `geoloco worker` and `geoloco launch`
// (and the multi-site tests, with ranks as threads) all run ranks through this.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>

#include "trainer/loop/run_config.hpp"

namespace geoloco::app {

struct RankOptions {
  int site = 0;
  int rank = 0;
  bool resume = false;
  int64_t stop_at_step = 0;
  bool progress = true;
  // site.device: cuda: pin this rank to a GPU (tests); -1 selects it from the local rank.
  int cuda_device = -1;
};

// Returns the run summary at global rank 0 (also written to summary.json), this rank's own
// summary elsewhere.
nlohmann::json run_rank(const trainer::RunConfig& cfg, const RankOptions& opts);

}  // namespace geoloco::app

// Trainer: one rank's inner loop, the native trainer. Reads its batches from the distributed
// sampler, runs forward/backward with gradient accumulation, lets the site strategy reduce
// gradients and apply the inner optimizer, hands each step to the outer loop (when there is
// one: outer::Diloco, through this rank's side of its seam, native_site.hpp), evaluates, and
// leaves its records to RunRecords (metrics.jsonl, rounds, live metrics; run_records.hpp), its
// checkpoints to RankCheckpoints (rank_checkpoints.hpp) and its timeline to trace_files.hpp.
//
// Output under run.output_dir:
//   metrics.jsonl, summary.json                 global rank 0 (the run's canonical view)
//   sites/<site>/metrics.jsonl                  each site's rank 0
//   sites/<site>/rank<r>.json                   every rank's own summary
//   sites/<site>/rounds.r<r>.jsonl, trace.r<r>.json   every rank's outer rounds and spans
//   checkpoints/<site>/...                      rank_checkpoints.hpp
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "outer_optimizer/site.hpp"
#include "trainer/loop/run_config.hpp"
#include "trainer/loop/site_strategy.hpp"

namespace geoloco::parallel {
class Collective;
}
namespace geoloco::outer {
class Diloco;
}

namespace geoloco::trainer {

struct TrainerOptions {
  int site = 0;         // index into cfg.sites
  int rank = 0;         // rank within the site
  bool resume = false;  // continue from checkpoints/<site>/latest when present
  // Join the running job from the other sites (outer::Diloco::join) instead of starting at step 0:
  // a restarted or new site. Its inner optimizer starts fresh; its sampler skips to the step.
  bool join = false;
  int64_t stop_at_step = 0;                    // stop cleanly (with a checkpoint) after this step; 0 = run to the end
  parallel::Collective* collective = nullptr;  // the site's collective (null: one-rank site)
  outer::Diloco* outer = nullptr;              // the cross-site loop (null: no outer loop)
  bool progress = true;                        // live progress line on a terminal
  // `geoloco launch`'s status view: the site's rank 0 writes one JSON status line per logged
  // step here (GEOLOCO_STATUS_FD; trainer/launch/status_block.hpp). -1: none.
  int status_fd = -1;
  // site.device: cuda: the GPU of this rank, already chosen by the caller (run_rank selects it
  // before creating NCCL); -1 lets the trainer select it (select_rank_device).
  int cuda_device = -1;
  // site.device: cuda with a one-rank collective: run its calls anyway (a one-rank site drops
  // its collective otherwise), so one GPU exercises NCCL inside the loop. For tests.
  bool keep_one_rank_collective = false;
};

class Trainer {
 public:
  Trainer(const RunConfig& cfg, const TrainerOptions& opts);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Runs to the end (or stop_at_step) and returns this rank's summary.
  nlohmann::json run();

  // The full parameters now (gathers under fsdp: a collective, call on every rank).
  std::vector<float> parameters();

  // The site strategy, this rank's side of the outer loop's seam (built on it), and the outer
  // loop to call; set it before run(). With --resume, run() restores the checkpoint (outer
  // state included).
  SiteStrategy& strategy();
  outer::Site& site();
  void set_outer(outer::Diloco* outer);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace geoloco::trainer

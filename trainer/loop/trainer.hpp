// Trainer: one rank's inner loop. Reads its batches from the distributed sampler, runs
// forward/backward with gradient accumulation, lets the site strategy reduce gradients and
// apply AdamW, hands control to the outer loop (when there is one) after every step, and
// writes metrics, checkpoints and the summary.
//
// Output layout under run.output_dir:
//   metrics.jsonl, summary.json                 global rank 0 (the run's canonical view)
//   sites/<site>/metrics.jsonl                  each site's rank 0
//   sites/<site>/rank<r>.json                   every rank's own summary
//   checkpoints/<site>/step_<N>/model.safetensors   HF GPT-2 names (site rank 0)
//   checkpoints/<site>/step_<N>/config.json         its GPT2Config: the step directory loads
//                                                   with GPT2LMHeadModel.from_pretrained
//   checkpoints/<site>/step_<N>/state.r<r>.safetensors   optimizer, sampler, outer state
//   checkpoints/<site>/latest                   name of the newest complete checkpoint
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "trainer/loop/outer_hook.hpp"
#include "trainer/loop/run_config.hpp"

namespace geoloco::parallel {
class Collective;
}

namespace geoloco::trainer {

struct TrainerOptions {
  int site = 0;         // index into cfg.sites
  int rank = 0;         // rank within the site
  bool resume = false;  // continue from checkpoints/<site>/latest when present
  // Join the running job from the other sites (OuterHook::join) instead of starting at step 0:
  // a restarted or new site. Its inner optimizer starts fresh; its sampler skips to the step.
  bool join = false;
  int64_t stop_at_step = 0;                    // stop cleanly (with a checkpoint) after this step; 0 = run to the end
  parallel::Collective* collective = nullptr;  // the site's collective (null: one-rank site)
  OuterHook* outer = nullptr;                  // the cross-site loop (null: no outer loop)
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

  // The site strategy (the outer loop is built on it), and the outer loop to call; set it
  // before run(). With --resume, run() restores the checkpoint (outer state included).
  SiteStrategy& strategy();
  void set_outer(OuterHook* outer);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Evaluate a model on a dataset: mean loss over `max_tokens` tokens (sequential windows).
struct EvalResult {
  double loss = 0;
  int64_t tokens = 0;
  int64_t windows = 0;
};

}  // namespace geoloco::trainer

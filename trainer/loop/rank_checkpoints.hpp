// RankCheckpoints: one rank's checkpoints of the native trainer -- writing them (the model in
// Hugging Face names by the site's rank 0, every rank's state: optimizer moments, shard,
// sampler, counters, the outer loop's state), keeping the newest, and on --resume finding the
// step every site holds (the outer loop's agreement) and restoring it.
//
// Layout under run.output_dir:
//   checkpoints/<site>/step_<N>/model.safetensors   HF GPT-2 names (site rank 0), with config.json:
//                                                   the directory loads with from_pretrained
//   checkpoints/<site>/step_<N>/state.r<r>.safetensors   optimizer, sampler, counters, outer state
//   checkpoints/<site>/latest                       name of the newest complete checkpoint
//   checkpoints/<site>/discarded/                   newer checkpoints --resume set aside
#pragma once

#include <cstdint>
#include <exception>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "trainer/data/sampler.hpp"
#include "trainer/loop/run_config.hpp"
#include "trainer/loop/site_strategy.hpp"

namespace geoloco::outer {
class Diloco;
}

namespace geoloco::trainer {

// What a checkpoint carries of the loop's own counters.
struct LoopCounters {
  int64_t step = 0;         // completed inner steps
  double wall_s = 0;        // wall seconds of this and earlier segments
  double compute_s = 0;     // time in forward/backward/optimizer
  double outer_wait_s = 0;  // inner loop blocked in the outer loop
  int64_t join_step = -1;   // the step this site joined the running job at (-1: it started with it)
};

class RankCheckpoints {
 public:
  // Everything outlives this; `log` prints a line (the site's rank 0 logs).
  RankCheckpoints(const RunConfig& cfg, int site, int rank, const ParamLayout& layout, SiteStrategy& strategy,
                  DistributedSampler& sampler, std::function<void(const std::string&)> log);

  // A checkpoint at c.step (every rank of the site: collectives inside), with the outer
  // loop's state when there is one; `latest` names it once every rank's state is on disk.
  void save(const LoopCounters& c, outer::Diloco* outer);
  // After a failure the outer loop can carry on from: a checkpoint now, best effort (the
  // original error still ends the rank; one that cannot be written is said, not thrown).
  void save_after_failure(const LoopCounters& c, outer::Diloco* outer, const std::exception& why);
  // --resume: the checkpoint every site holds restored (strategy, sampler, outer state), and
  // its counters; nothing when there is none (a fresh start).
  std::optional<LoopCounters> restore(outer::Diloco* outer);
  // The model file of step `step`'s checkpoint (the summary names it).
  std::string model_path(int64_t step) const;

 private:
  std::string state_file(const std::filesystem::path& dir) const;
  void barrier();
  void prune();
  std::vector<int64_t> site_steps();
  std::filesystem::path resume_directory(outer::Diloco* outer);

  const RunConfig& cfg_;
  const SiteConfig& site_;
  int rank_;
  const ParamLayout& layout_;
  SiteStrategy& strategy_;
  DistributedSampler& sampler_;
  std::function<void(const std::string&)> log_;
  std::filesystem::path dir_;  // checkpoints/<site>
};

}  // namespace geoloco::trainer

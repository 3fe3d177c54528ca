// OuterSession: geoloco's outer loop for one rank of a site whose inner loop is another
// program's (a PyTorch script): the run's YAML read as `geoloco launch` reads it, the rank's
// transport to the other sites, the outer loop (outer::Diloco) over a HostSite, the records
// (metrics.jsonl, rounds, the Prometheus endpoint, summary.json) and the run's summary
// gathered at the end. The Python package (python/geoloco) drives it; nothing here knows torch.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "outer_optimizer/site.hpp"
#include "python/native/host_site.hpp"

namespace geoloco {
namespace trainer {
struct RunConfig;
class RunRecords;
}  // namespace trainer
namespace python {
class SessionCheckpoints;
}
namespace transport {
class Transport;
}
namespace outer {
class Diloco;
}

namespace python {

struct SessionOptions {
  std::string config;             // the run's YAML
  std::vector<std::string> sets;  // --set overrides, "a.b=v"
  std::string site;               // this rank's site (by name)
  int rank = 0;                   // its rank within the site
  bool join = false;              // a restarted site: joins the running job
  bool resume = false;            // --resume: records continue (resume() restores the checkpoint)
  uint64_t tokens_per_step = 0;   // the site's tokens per inner step, over all its ranks
  int64_t total_steps = 0;        // 0: train.steps of the config
};

// The model's tensors as the outer loop cuts them: a tensor belongs to the block named by the
// first integer component of its dotted name ("h.3.attn.weight", "model.layers.3.mlp..."),
// and to none (-1) without one; matrices (2 or more dimensions) are rows of shape[0].
outer::ModelParams model_params_of(const std::vector<HostTensor>& tensors);
// A hash of the tensors' names, shapes and order: a checkpoint of other parameters is refused
// (the sites compare their layouts line by line when they connect).
uint64_t layout_hash(const std::vector<HostTensor>& tensors);

class OuterSession {
 public:
  // `tensors`: what this rank holds. `model`: empty when it holds the whole model (then
  // `tensors` is the model); else the model's tensors by name and shape (no data) and `tensors`
  // this rank's shard of their flat values, shard_of(total, rank, ranks) (a sharded inner loop).
  OuterSession(const SessionOptions& options, std::vector<HostTensor> tensors, std::vector<HostTensor> model,
               HostSiteCallbacks callbacks);
  ~OuterSession();
  OuterSession(const OuterSession&) = delete;
  OuterSession& operator=(const OuterSession&) = delete;

  // A joining site: fetches the committed state (written into the tensors), returns its step.
  int64_t join();
  // --resume: the checkpoint every site holds restored (parameters, outer state); returns its
  // step and the program's inner state as it was saved, or nothing (no checkpoint: fresh).
  std::optional<std::pair<int64_t, std::vector<uint8_t>>> resume();
  // A checkpoint after step `step` (the last one reported) with the program's inner state.
  // Every rank of the site calls it at the same step (checkpoint_every's multiples).
  void save_checkpoint(int64_t step, std::span<const uint8_t> inner);
  int64_t checkpoint_every() const;
  // Before inner step `step`: false when the site skips it (outer.pace: time).
  bool trains_step(int64_t step);
  // After inner step `step` with the site's mean `loss` (NaN: not given): the outer loop's
  // work at that step, the records. True when an outer round completed.
  bool after_step(int64_t step, double loss);
  // After the last step: every fragment synced blocking (at train.steps), the records closed,
  // the run's summary gathered; returns this rank's summary (the run's at its writer).
  nlohmann::json finish(int64_t step);

  // Closes the transport (the other sites see this rank leave) and the records; idempotent. The
  // destructor does it too; Python calls it at finish() and at exit, before the process tears
  // down the logger the transport's thread reports to.
  void close();

  int64_t total_steps() const { return total_steps_; }
  int64_t log_every() const;
  nlohmann::json metrics();
  std::string output_dir() const;
  uint64_t global_weights_hash() const;
  int site_index() const { return site_; }
  bool in_place() const { return host_.in_place(); }

 private:
  std::unique_ptr<trainer::RunConfig> cfg_;
  int site_ = 0, rank_ = 0;
  int64_t total_steps_ = 0;
  uint64_t tokens_per_step_ = 0;
  HostSite host_;
  std::unique_ptr<transport::Transport> tp_;
  std::unique_ptr<outer::Diloco> outer_;
  std::unique_ptr<trainer::RunRecords> records_;
  std::unique_ptr<SessionCheckpoints> checkpoints_;
  std::chrono::steady_clock::time_point start_, window_t0_;
  int64_t window_steps_ = 0, trained_steps_ = 0, last_step_ = 0;
  double window_loss_ = 0, last_loss_ = 0;
  double outer_wait_s_ = 0;  // the program blocked in the outer loop (after_step, finish)
  int window_losses_ = 0;
  bool finished_ = false;
  uint64_t final_hash_ = 0;  // the global weights' hash once closed
};

}  // namespace python
}  // namespace geoloco

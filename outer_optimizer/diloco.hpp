// Diloco: the outer loop of one rank (DiLoCo, Douillard et al. 2023), shard-parallel.
//
// Every `interval` inner steps, rank r of every site:
//   1. computes its pseudo-gradient on its shard: delta = global - local;
//   2. compresses it (error feedback optional) and sends it to rank r of every other site,
//      receiving theirs (one UCX connection -- or `lanes` -- per peer pair, in parallel
//      with every other rank of the site);
//   3. decodes every site's frame, its own included, and sums them in site order with the
//      site weights -- so every site computes bit-identical averages;
//   4. applies the outer optimizer to its shard of the global weights;
//   5. overwrites its local shard with the new global shard; the site all-gathers.
// Then the shard hashes are compared with the other sites (a mismatch stops the run) and
// combined into a site-wide hash that is logged.
//
// Overlap (outer.overlap_steps = tau > 0, or outer.delayed_update): steps 1-4 run on a
// worker thread from a snapshot of the local shard taken at the sync step, while the inner
// loop keeps training; tau steps later the inner loop joins the worker (the exposed wait)
// and merges: local <- alpha * local + (1 - alpha) * global, then the site all-gathers.
// Joins and merges happen on the inner loop's thread at fixed steps, so every rank calls
// the site's collectives at the same step and every site computes the same global weights.
// The last step of the run always syncs blocking, so all sites end bit-identical.
#pragma once

#include <chrono>
#include <exception>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <thread>
#include <vector>

#include "compression/error_feedback.hpp"
#include "compression/pipeline.hpp"
#include "outer_optimizer/outer_config.hpp"
#include "outer_optimizer/outer_optimizer.hpp"
#include "trainer/loop/outer_hook.hpp"
#include "trainer/loop/run_config.hpp"
#include "transport/transport.hpp"

namespace geoloco::outer {

class Diloco : public trainer::OuterHook {
 public:
  // `transport` connects this rank to rank r of every other site (null for a one-site run);
  // its peers must be ordered as the other sites appear in cfg.sites.
  Diloco(const trainer::RunConfig& cfg, int site, int rank, transport::Transport* transport,
         trainer::SiteStrategy& strategy);
  ~Diloco() override;
  Diloco(const Diloco&) = delete;
  Diloco& operator=(const Diloco&) = delete;

  bool after_inner_step(int64_t step, trainer::SiteStrategy& strategy) override;
  void finish(int64_t step, trainer::SiteStrategy& strategy) override;
  nlohmann::json metrics() override;
  nlohmann::json summary() override;
  State save_state() override;
  void restore_state(const trainer::SafetensorsFile& file) override;
  void set_trace(trainer::TraceRecorder* trace) override { trace_ = trace; }

  int64_t rounds() const { return round_; }
  uint64_t site_hash() const { return site_hash_; }

 private:
  struct ExchangeResult {
    uint64_t envelope_bytes = 0, frame_bytes = 0, elements = 0;
    double ratio = 0;
  };
  bool overlapped() const;
  int64_t tau() const;
  uint64_t period_tokens(int64_t step) const;
  // Blocking sync (the plain outer loop).
  void sync(int64_t step, trainer::SiteStrategy& strategy);
  // Steps 1-4 on `local`: pseudo-gradient, compress, exchange, decode, average, outer
  // optimizer step on global_. Touches no collective (runs on the worker when overlapped).
  ExchangeResult exchange(int64_t step, uint64_t round, uint64_t tokens, std::span<const float> local, int tid);
  // Overlap: start a round on the worker; join it; join + merge + all-gather.
  void launch(int64_t step, trainer::SiteStrategy& strategy);
  void join_worker();
  void complete(trainer::SiteStrategy& strategy);
  // Hash check, site hash (a collective) and accounting of a finished round.
  void finish_round(trainer::SiteStrategy& strategy, int64_t step, uint64_t round, double seconds,
                    const ExchangeResult& r);
  uint64_t combine_site_hash(trainer::SiteStrategy& strategy, uint64_t shard_hash);
  void check_hashes(uint64_t shard_hash, uint64_t round);
  std::string peer_name(int site) const;

  const trainer::RunConfig& cfg_;
  const OuterConfig& ocfg_;
  int site_, rank_;
  transport::Transport* transport_;
  std::vector<int> peer_of_site_;  // site index -> transport peer index (-1 for self)
  size_t n_;                       // shard elements
  std::vector<float> global_;      // global weights, this shard
  std::vector<float> delta_, decoded_, avg_;
  std::unique_ptr<compression::Pipeline> pipeline_;
  std::unique_ptr<compression::ErrorFeedback> ef_;
  OuterOptimizer opt_;
  int64_t round_ = 0;
  int64_t last_sync_step_ = 0;
  uint64_t site_hash_ = 0;
  trainer::TraceRecorder* trace_ = nullptr;  // spans of the sync's phases (null: none)

  // Overlap state. The worker owns delta_/decoded_/avg_/global_/pipeline_/ef_/opt_/
  // snapshot_ while in_flight_; the inner loop touches them only after join_worker().
  std::thread worker_;
  bool in_flight_ = false;      // worker started, not joined
  bool pending_merge_ = false;  // a round's global weights await their merge at merge_step_
  int64_t merge_step_ = 0, launch_step_ = 0;
  uint64_t launch_round_ = 0;
  std::vector<float> snapshot_;
  ExchangeResult worker_result_;
  std::exception_ptr worker_error_;
  std::chrono::steady_clock::time_point launch_t0_, worker_t1_;
  double joined_seconds_ = 0;   // launch to worker end of the joined round
  bool joined_ = false;

  // Measurements.
  std::vector<double> sync_seconds_;
  uint64_t frame_bytes_total_ = 0, elements_total_ = 0;
  double last_sync_s_ = 0;
  uint64_t last_frame_bytes_ = 0;
};

}  // namespace geoloco::outer

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
#pragma once

#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
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

  bool after_inner_step(int64_t step, trainer::SiteStrategy& strategy) override;
  void finish(int64_t step, trainer::SiteStrategy& strategy) override;
  nlohmann::json metrics() override;
  nlohmann::json summary() override;
  State save_state() override;
  void restore_state(const trainer::SafetensorsFile& file) override;

  int64_t rounds() const { return round_; }
  uint64_t site_hash() const { return site_hash_; }

 private:
  void sync(int64_t step, trainer::SiteStrategy& strategy);
  uint64_t combine_site_hash(trainer::SiteStrategy& strategy, uint64_t shard_hash);
  void check_hashes(uint64_t shard_hash);
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

  // Measurements.
  std::vector<double> sync_seconds_;
  uint64_t frame_bytes_total_ = 0, elements_total_ = 0;
  double last_sync_s_ = 0;
  uint64_t last_frame_bytes_ = 0;
};

}  // namespace geoloco::outer

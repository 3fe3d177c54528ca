// SiteStrategy: how the ranks of one site train one model replica together.
//
//   ddp    parameters, gradients and optimizer state replicated; gradients all-reduced in
//          buckets; every rank applies the same update.
//   zero1  gradients all-reduced; optimizer state sharded: rank r updates only its shard of the
//          parameters, then the shards are all-gathered.
//   zero2  gradients reduce-scattered (each rank keeps the reduced gradient of its shard
//          only), optimizer state sharded, parameters all-gathered after the update.
//   fsdp   parameters sharded too: the full parameter buffer is gathered for the step and
//          released after it; gradients reduce-scattered; the optimizer on the shard.
//   hybrid fsdp inside groups of G consecutive ranks (an NVLink island), replicated across the
//          N/G groups (trainer/parallel/hybrid_shard.hpp): each rank holds n/G parameters; a
//          step all-gathers them inside its group, reduce-scatters the gradient inside the
//          group, then over its replica set (one rank per group), so the optimizer runs on the
//          rank's site shard (n/N, as zero2/fsdp) and the updated shard is all-gathered over
//          the replica set. Every collective is over a subgroup (Collective::split) except the
//          gradient norm's sum.
//
// The optimizer is AdamW, or Muon on the block matrices (train.optimizer.kind): a sharded
// site's Muon step broadcasts, once per step, the parts of the matrices the ranks' shards cut
// (muon_cut_parts), since Newton-Schulz needs each matrix whole (trainer/optim/inner_optimizer.hpp);
// a matrix inside one shard costs nothing.
//
// A rank's site shard is shard_of(num_params, rank, ranks) under every strategy, and
// the outer loop syncs exactly that shard with the same rank of the other sites.
//
// Equivalences (tests/loop): zero1 == ddp bit for bit; zero2 and fsdp differ from ddp only
// in the rounding of the global gradient norm (sum of per-shard squares), i.e. bit-equal
// when clipping is inactive; ddp on N ranks == 1 rank with N x micro_batch up to the
// summation order of the gradient; hybrid with G = N is fsdp and with G = 1 zero2, bit for bit,
// and otherwise ddp up to the summation order (group sums, then sums over groups).
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "outer_optimizer/device_outer.hpp"
#include "trainer/model/param_layout.hpp"
#include "trainer/optim/inner_optimizer.hpp"
#include "trainer/parallel/collective.hpp"
#include "trainer/parallel/hybrid_shard.hpp"
#include "core/shard.hpp"

namespace geoloco::trainer {

enum class StrategyKind { Ddp, Zero1, Zero2, Fsdp, Hybrid };
StrategyKind parse_strategy(const std::string& name);
const char* strategy_name(StrategyKind k);

struct StepResult {
  double grad_norm = 0;  // global norm before clipping
  float clip_scale = 1;  // scale applied (1 = not clipped)
};

// The optimizer state of this rank's range in host memory (checkpoints). On the CPU the
// spans view the live moments; a device strategy downloads them into m_copy/v_copy.
struct OptimizerHostState {
  int64_t begin = 0, end = 0;  // absolute range of the flat layout
  int64_t steps = 0;
  std::span<const float> m, v;
  std::vector<float> m_copy, v_copy;
};

// The CPU implementation (host buffers, trainer::InnerOptimizer). The outer loop and the trainer see
// it through the virtual members below; a device variant (trainer/loop/cuda_site_strategy.hpp,
// CUDA builds) derives from it, keeps parameters, gradients and optimizer state on the GPU and
// implements the same contract: shard_params() is then a pinned host mirror staged from the
// device at each call, and shard_updated() uploads it back.
class SiteStrategy {
 public:
  // `coll` may be null for a one-rank site. Parameters start as `initial` (full buffer, same
  // on every rank). optimizer_state: false keeps no optimizer moments (an empty range: a
  // rehearsal's stand-in inner loop never steps the optimizer). group_size: hybrid's G (it
  // must divide the rank count); ignored by the other strategies. Hybrid splits `coll` into
  // its group and replica set here: every rank of the site constructs its strategy together.
  SiteStrategy(StrategyKind kind, const ParamLayout& layout, parallel::Collective* coll,
               const OptimizerConfig& optimizer, std::span<const float> initial, bool optimizer_state = true,
               int group_size = 0);
  virtual ~SiteStrategy();
  SiteStrategy(const SiteStrategy&) = delete;
  SiteStrategy& operator=(const SiteStrategy&) = delete;

  StrategyKind kind() const { return kind_; }
  int rank() const { return coll_ ? coll_->rank() : 0; }
  int ranks() const { return coll_ ? coll_->size() : 1; }
  ShardRange shard() const { return shard_; }
  // hybrid: ranks per group (the others: 0).
  int group_size() const { return hybrid_ ? hybrid_->group_size : 0; }
  // Muon on a sharded site: the parts of the matrices the ranks' shards cut (muon_cut_parts),
  // what the step's gather broadcasts.
  const std::vector<GatherPart>& muon_parts() const { return muon_parts_; }
  // hybrid: the layout (null under the other strategies) and the two subgroups (null when of
  // one rank): the group's collectives stay inside an island, the replica set's cross islands.
  const parallel::HybridShards* hybrid() const { return hybrid_.get(); }
  parallel::Collective* group_collective() const { return group_coll_.get(); }
  parallel::Collective* replica_collective() const { return replica_coll_.get(); }

  // Host memory only (the CPU strategy; a device strategy has its own step on device spans).
  // Full parameter buffer for forward/backward (gathers it under fsdp) and zeroed grads.
  std::span<const float> begin_step();
  std::span<float> grads() { return grads_; }
  // Reduces gradients across the site, clips to max_norm (0 = off), applies the optimizer with
  // `lr`, and leaves parameters consistent (replicated, or sharded under fsdp).
  StepResult finish_step(double lr, double max_norm);

  // This rank's shard of the parameters (persistent under every strategy): the outer loop
  // reads and overwrites it, then calls shard_updated(). Host memory in every strategy.
  virtual std::span<float> shard_params();
  // Makes every rank's full parameters consistent after shards were overwritten
  // (all-gather; nothing under fsdp, which gathers at the next step).
  virtual void shard_updated();
  // The outer loop's device side (device_outer.hpp) on a GPU site; null on the CPU (the host
  // path: shard_params() / shard_updated()).
  virtual outer::DeviceOuter* device_outer() { return nullptr; }
  // Full parameters in host memory (gathers under fsdp; the returned buffer is valid until
  // the next call).
  virtual std::span<const float> full_params();
  // Frees the buffer full_params() gathered (fsdp; a device strategy's host copy): at real
  // size it is a whole model per rank, needed only while a checkpoint or a hash reads it.
  virtual void release_full_params();

  // The CPU optimizer. A device strategy returns a host proxy without moments whose reset()
  // (the outer loop's inner_state: reset) is applied to the device optimizer before the next
  // update; use optimizer_state()/load_optimizer() for the moments.
  InnerOptimizer& optimizer() { return *opt_; }
  parallel::Collective* collective() { return coll_; }

  // The optimizer moments of this rank's range in host memory, and their restore.
  virtual OptimizerHostState optimizer_state();
  virtual void load_optimizer(std::span<const float> m, std::span<const float> v, int64_t steps);

  // Site-wide mean of a per-rank scalar (no-op for one rank).
  virtual double site_mean(double v);
  // Site-wide sum of host doubles, in place (no-op for one rank).
  virtual void site_sum(std::span<double> v);

  // Bytes held per rank (persistent, and peak transient during a step) and bytes moved by
  // the site collectives per step, for summary.json.
  virtual nlohmann::json memory_json() const;

 protected:
  // For a device strategy: kind, layout, collective and shard as above, no host buffers, and
  // an optimizer proxy with an empty range (steps and reset only).
  // keep_one_rank_collective: keep a collective of one rank (dropped otherwise: a sum over one
  // rank is the identity), so one GPU runs every NCCL call of the loop (tests).
  struct NoHostState {
    bool keep_one_rank_collective = false;
    int group_size = 0;  // hybrid
  };
  SiteStrategy(StrategyKind kind, const ParamLayout& layout, parallel::Collective* coll,
               const OptimizerConfig& optimizer, NoHostState);
  const ParamLayout& layout() const { return layout_; }
  int64_t num_params() const { return n_; }

 private:
  // hybrid: the layout, and the site collective split into the rank's group and replica set.
  void init_hybrid(int group_size);
  void plan_muon_parts(const OptimizerConfig& optimizer);  // muon_parts_ for a sharded site
  void reduce_full_grads();                                // ddp/zero1: bucketed all-reduce, divided by ranks
  InnerOptimizer::Gather site_gather();  // Muon: the cut matrices' parts broadcast (none for one rank)
  // hybrid: the full parameters into gathered_ (the held pieces, each block all-gathered in the group).
  void gather_held();
  std::span<float> own_held();  // hybrid: the own site shard inside the held pieces
  // hybrid: the own shard in params_ to every replica (all-gather over the replica set).
  void share_own_shard();
  StepResult finish_hybrid_step(double lr, double max_norm);
  // zero2/fsdp/hybrid: the global norm of the sharded gradient (squares summed over the site)
  // into r, and grad_shard_ clipped to max_norm (0 = off).
  void clip_grad_shard(StepResult& r, double max_norm);
  void require_host(const char* what) const;

  StrategyKind kind_;
  const ParamLayout& layout_;
  parallel::Collective* coll_;
  ShardRange shard_;
  int64_t n_;
  // hybrid: the layout and the two subgroups (null when of one rank).
  std::unique_ptr<parallel::HybridShards> hybrid_;
  std::unique_ptr<parallel::Collective> group_coll_, replica_coll_;
  std::vector<float> params_;      // full (ddp/zero), shard-sized (fsdp: shard at index 0), held pieces (hybrid)
  std::vector<float> gathered_;    // fsdp: full params during a step, released after
  std::vector<float> grads_;       // full gradient buffer for backward
  std::vector<float> grad_shard_;  // zero2/fsdp: reduced gradient of my shard
  std::unique_ptr<InnerOptimizer> opt_;
  int64_t bucket_elems_ = int64_t{1} << 22;  // 16 MiB of fp32 per all-reduce call
  size_t peak_transient_bytes_ = 0;
  std::vector<GatherPart> muon_parts_;
  bool host_ = true;  // false: a device strategy (no host buffers here)
};

}  // namespace geoloco::trainer

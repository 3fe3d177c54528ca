// CudaSiteStrategy: a site strategy (ddp, zero1, zero2, fsdp, hybrid) on one GPU per rank, over the
// site's device collective (NCCL). The same semantics as SiteStrategy (site_strategy.hpp),
// with device buffers sized by plan_device_buffers() (device_plan.hpp):
//   * CudaGpt computes forward/backward on the model's stream; CudaInnerOptimizer updates on it;
//   * ddp/zero1 on several ranks all-reduce each block's gradient while the backward pass of
//     the blocks below still runs (OverlappedAllReduce, hook on the last micro-batch);
//     zero2/fsdp reduce-scatter after the backward pass (shards do not align with blocks);
//     hybrid reduce-scatters each block inside its group, then the held pieces over its replica
//     set, and gathers through both subgroups (SiteStrategy's hybrid on device buffers);
//   * before any collective on buffers the model stream wrote, that stream is synchronised
//     (NCCL runs on its own stream); collectives return when their result is in place;
//   * clipping: the squared norm of the (reduced) gradient on the device, summed over the
//     shards for zero2/fsdp as on the CPU;
//   * the outer loop's host contract: shard_params() downloads the rank's shard into a pinned
//     mirror through HostStager (copy stream ordered after the model stream by an event) and
//     returns it; shard_updated() uploads the mirror and all-gathers (ddp/zero1/zero2);
//     device_outer() is the outer loop's device side instead (cuda_outer_stage.hpp: the
//     pseudo-gradient quantized on the device, the merge there);
//   * optimizer(): a host proxy; its reset() (outer.inner_state: reset) is applied to the
//     device moments before the next update.
// Only in CUDA builds (compiled into geoloco_loop when GEOLOCO_HAVE_CUDA).
#pragma once

#include <memory>
#include <vector>

#include "trainer/cuda/cuda_inner_optimizer.hpp"
#include "trainer/cuda/cuda_gpt.hpp"
#include "trainer/cuda/device.hpp"
#include "trainer/cuda/grad_overlap.hpp"
#include "trainer/cuda/handles.hpp"
#include "trainer/cuda/ops.hpp"
#include "trainer/cuda/staging.hpp"
#include "trainer/loop/cuda_outer_stage.hpp"
#include "trainer/loop/device_plan.hpp"
#include "trainer/loop/device_site.hpp"
#include "trainer/loop/run_config.hpp"

namespace geoloco::trainer {

class CudaSiteStrategy final : public SiteStrategy, public DeviceSite {
 public:
  CudaSiteStrategy(const RunConfig& cfg, int site, const ParamLayout& layout, parallel::Collective* coll,
                   std::span<const float> initial, int device, bool keep_one_rank_collective = false);
  ~CudaSiteStrategy() override;

  // DeviceSite
  SiteStrategy& strategy() override { return *this; }
  double forward_backward(const NextBatch& next, int B, int T, int K) override;
  StepResult finish_step(double lr, double max_norm) override;
  void begin_eval() override;
  double eval_batch(const int32_t* inputs, const int32_t* targets, int rows, int T) override;
  void end_eval() override;
  nlohmann::json describe() const override;

  // SiteStrategy (host contract)
  std::span<float> shard_params() override;
  void shard_updated() override;
  outer::DeviceOuter* device_outer() override;
  std::span<const float> full_params() override;
  void release_full_params() override { std::vector<float>().swap(host_full_); }
  OptimizerHostState optimizer_state() override;
  void load_optimizer(std::span<const float> m, std::span<const float> v, int64_t steps) override;
  double site_mean(double v) override;
  void site_sum(std::span<double> v) override;
  nlohmann::json memory_json() const override;

  const DeviceBufferPlan& plan() const { return plan_; }

 private:
  cuda::OpContext ops() const;
  void sync_compute();
  // Device span of this rank's shard of the parameters (inside the full buffer, or the
  // buffer itself under fsdp).
  std::span<float> shard_on_device();
  // fsdp: the full parameters into d_gathered_ (allocated if needed). Collective.
  void gather_full();
  std::span<const float> full_on_device() const;
  // fsdp and hybrid gather the full parameters for a step (and an evaluation).
  bool gathers() const { return kind() == StrategyKind::Fsdp || kind() == StrategyKind::Hybrid; }
  StepResult finish_hybrid_step(double lr, double max_norm);
  // hybrid: the held pieces (device, held layout) each at its place in `full` (n elements), then
  // each block all-gathered inside the group. Collective over the group.
  void held_into_full(const float* held, std::span<float> full);
  void clip(std::span<float> g, StepResult& r, double max_norm);
  // zero2/fsdp/hybrid: the global norm of the gradient shard `gs` (squares summed over the
  // site) into r, and gs clipped to max_norm.
  void clip_sharded(std::span<float> gs, StepResult& r, double max_norm);
  // hybrid: the own shard (device) to every replica (all-gather over the replica set).
  void share_own_shard();
  void apply_pending_reset();
  // The collective part of shard_updated(): the updated shard to the site's other ranks.
  void share_shard();
  // A sharded Muon step's gather: the cut matrices' parts broadcast (none under ddp or for one rank).
  cuda::CudaInnerOptimizer::Gather device_gather();

  int device_;
  cuda::DeviceInfo info_;
  std::string precision_;
  std::string backend_;
  DeviceBufferPlan plan_;
  cuda::CudaGpt model_;
  cuda::DeviceBuffer<float> d_params_, d_grad_shard_;
  // Transient for zero2/fsdp (released after the reduce-scatter / the step): stream-ordered,
  // so the next step's allocation comes from the device pool without a synchronisation.
  cuda::StreamBuffer<float> d_grads_, d_gathered_;
  cuda::DeviceBuffer<double> d_scalars_;
  cuda::DeviceBuffer<unsigned char> d_work_;  // scratch of the norm reduction
  cuda::CudaInnerOptimizer adam_;
  cuda::HostStager mirror_;
  std::unique_ptr<cuda::OverlappedAllReduce> overlap_;
  std::unique_ptr<CudaOuterStage> outer_stage_;  // made at the first device_outer()
  std::vector<float> host_full_;
  size_t peak_activation_bytes_ = 0;
};

}  // namespace geoloco::trainer

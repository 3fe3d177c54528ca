// DeviceSite: the inner loop's compute on an accelerator (site.device: cuda). The trainer
// keeps its sampler, metrics, checkpoints and outer-loop calls; per step it hands the host
// batches to forward_backward() and the update to finish_step(), both on the device. The
// same object is the site's SiteStrategy (strategy()), so the outer loop and checkpoints use
// the host contract of site_strategy.hpp unchanged.
//
// make_device_site() is defined in cuda_site_strategy.cpp in CUDA builds; in a build without
// CUDA (device_site_none.cpp) it throws ConfigError saying so.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>

#include "trainer/loop/site_strategy.hpp"

namespace geoloco::trainer {

struct RunConfig;

class DeviceSite {
 public:
  virtual ~DeviceSite() = default;
  virtual SiteStrategy& strategy() = 0;

  // Fills host arrays [B*T] with the next micro-batch's inputs and targets.
  using NextBatch = std::function<void(int32_t* inputs, int32_t* targets)>;
  // Zeroes the gradients and runs K micro-batches of forward + backward (loss scaled 1/K);
  // returns the mean loss. Under fsdp the full parameters are gathered first.
  virtual double forward_backward(const NextBatch& next, int B, int T, int K) = 0;
  // Reduces the gradients across the site, clips, applies AdamW with `lr` (see
  // SiteStrategy::finish_step: the same semantics).
  virtual StepResult finish_step(double lr, double max_norm) = 0;

  // Evaluation of the current parameters: begin_eval() (collective under fsdp: every rank
  // calls it), any number of eval_batch() calls on host tokens, end_eval().
  virtual void begin_eval() = 0;
  virtual double eval_batch(const int32_t* inputs, const int32_t* targets, int rows, int T) = 0;
  virtual void end_eval() = 0;

  // "cuda:0 (NVIDIA H200, sm_90), bf16, ddp, 2 ranks over nccl" for the start-up log and summary.json.
  virtual nlohmann::json describe() const = 0;
};

struct DeviceSiteOptions {
  int device = -1;                        // CUDA device index, already selected for this thread (select_device)
  bool keep_one_rank_collective = false;  // TrainerOptions::keep_one_rank_collective
};

// Builds the device strategy of `site` for this rank. `layout` must outlive it; `coll` is the
// site's collective (device memory, i.e. NCCL; null for a one-rank site); `initial` the full
// initial parameters on the host (the same bits as the CPU path). Throws ConfigError in a
// build without CUDA.
std::unique_ptr<DeviceSite> make_device_site(const RunConfig& cfg, int site, const ParamLayout& layout,
                                             parallel::Collective* coll, std::span<const float> initial,
                                             const DeviceSiteOptions& opts);

// Selects and makes current (for this thread) the GPU of (site, rank): `requested` >= 0 pins
// it, else the rank's local rank among all ranks of the config on the same host
// (local_rank_of in device_plan.hpp). Call before creating the site's NCCL communicator.
// Errors name the site and rank: CudaNoDevice (with the CUDA runtime's reason),
// CudaArchMismatch, ConfigError (more ranks on a host than GPUs); ConfigError in a build
// without CUDA.
int select_rank_device(const RunConfig& cfg, int site, int rank, int requested = -1);

// True when this binary was built with the CUDA backend.
bool built_with_cuda();

}  // namespace geoloco::trainer

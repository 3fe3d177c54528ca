// What a device strategy holds on the GPU and in pinned host memory per rank, by strategy:
// plain host logic (sizes, ranges, whether the gradient all-reduce can overlap the backward
// pass), shared by the CUDA strategy and its CPU tests (tests/trainer/loop/test_device_plan.cpp).
//
//            params        grads (full)        grad shard   gathered (full)   AdamW range   overlap
//   ddp      full          persistent          -            -                 [0, n)        ranks > 1
//   zero1    full          persistent          -            -                 shard         ranks > 1
//   zero2    full          during the step     shard        -                 shard         no
//   fsdp     shard         during the step     shard        during the step   shard         no
//   hybrid   held pieces   during the step     shard        during the step   shard         no
//            (n/G: parallel/hybrid_shard.hpp; the held gradient pieces, n/G, live during the step)
//
// "During the step" buffers are stream-ordered allocations returned to the device's memory
// pool after use (CudaSiteStrategy, cuda::StreamBuffer): reserved by the process, reused by
// the next step without a synchronisation.
//
// Every strategy also holds a pinned host mirror of the rank's shard (the outer loop's view,
// SiteStrategy::shard_params()) and, for ddp/zero1 on several ranks, one event per block.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>

#include "trainer/loop/site_strategy.hpp"
#include "core/shard.hpp"

namespace geoloco::trainer {

struct DeviceBufferPlan {
  StrategyKind kind = StrategyKind::Ddp;
  int64_t n = 0;                       // parameters of the model
  ShardRange shard;                    // this rank's shard
  int64_t param_elems = 0;             // persistent device parameters
  int64_t grad_elems = 0;              // the full gradient buffer (backward writes it)
  bool grads_persistent = true;        // false: allocated for the step, released after the reduce-scatter
  int64_t grad_shard_elems = 0;        // zero2/fsdp: the reduced gradient of the shard
  int64_t gathered_elems = 0;          // fsdp: full parameters during a step (and evaluation)
  int64_t opt_begin = 0, opt_end = 0;  // AdamW moments' range (absolute)
  int64_t mirror_elems = 0;            // pinned host mirror of the shard
  bool overlap = false;                // gradient all-reduce per block during backward

  int64_t opt_elems() const { return opt_end - opt_begin; }
  // Device bytes held between steps and the peak during a step (fp32, model activations not
  // included: CudaGpt::device_bytes() reports those).
  uint64_t persistent_device_bytes() const;
  uint64_t peak_device_bytes() const;
  nlohmann::json to_json() const;
};

// group_size: hybrid's G (ignored by the others).
DeviceBufferPlan plan_device_buffers(StrategyKind kind, int64_t n, int rank, int ranks, int group_size = 0);

struct RunConfig;
// The local rank of (site, rank) among every rank of the config whose address
// (SiteConfig::node_key) is the same, in config order (sites, then ranks), and how many
// there are: rank r of a site spread over several nodes gets its node's GPUs, and two sites
// on one node take disjoint GPUs.
struct LocalRank {
  int rank = 0;
  int ranks = 1;
};
LocalRank local_rank_of(const RunConfig& cfg, int site, int rank);

}  // namespace geoloco::trainer

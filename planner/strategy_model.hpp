// geoloco topo's cost model: per-step communication time and memory per GPU of ddp, zero1,
// zero2, fsdp and hybrid (shard inside an NVLink island, replicate across islands) on a
// Topology, and a recommendation with its reason.
//
// Collectives are rings bounded by their slowest hop (alpha-beta: each of the ring's steps
// pays the hop latency plus its chunk at the bottleneck bandwidth). Overlap follows the
// order of events in a step, simulated with one FIFO link queue:
//   ddp    all-reduce of gradient buckets as they become ready during backward (with gradient
//          accumulation, only in the last micro-batch's backward)
//   zero1  reduce-scatter of gradient buckets during backward, then all-gather of the updated
//          bf16 parameters after the optimizer step (same bytes as an all-reduce)
//   zero2  as zero1, but gradients are sharded too (less memory), so every micro-batch
//          reduce-scatters its gradients
//   fsdp   per layer: all-gather before forward (next layer prefetched), all-gather again
//          before backward, reduce-scatter after; compute waits for its layer's gather; all of
//          it again for every micro-batch (parameters are not kept between micro-batches)
//   hybrid fsdp inside each island, plus an all-reduce of each layer's gradient shard
//          across islands on its own (slower) links
// Memory per GPU: bf16 parameters (2 B), bf16 gradients (2 B), fp32 master weights and two
// Adam moments (12 B) per parameter, sharded per strategy (hybrid as geoloco runs it: parameters
// and gradients over the island, the optimizer state over every GPU), plus the activations given.
#pragma once

#include <nlohmann/json.hpp>

#include <span>
#include <string>
#include <vector>

#include "planner/topology.hpp"

namespace geoloco::planner {

struct Workload {
  double params = 0;
  int layers = 0;         // FSDP units; 0 -> from the model config, else 32
  double compute_s = 0;   // forward + backward of one step on one GPU
  int micro_batches = 1;  // gradient accumulation: micro-batches per optimizer step
  double gpu_memory_bytes = 80e9;
  double activation_bytes = 0;        // per GPU, whatever the strategy
  double param_bytes = 2;             // bf16 weights, and what fsdp/zero gather
  double grad_bytes = 2;              // what gradient collectives carry
  double optimizer_bytes = 12;        // fp32 master + Adam m and v
  double bucket_bytes = 25e6;         // DDP/ZeRO gradient bucket (PyTorch default 25 MB)
  double forward_fraction = 1.0 / 3;  // backward costs about twice the forward
};

enum class Strategy { DDP, Zero1, Zero2, FSDP, Hybrid };
const char* strategy_name(Strategy s);
inline constexpr Strategy kAllStrategies[] = {Strategy::DDP, Strategy::Zero1, Strategy::Zero2, Strategy::FSDP,
                                              Strategy::Hybrid};

struct StrategyCost {
  Strategy strategy = Strategy::DDP;
  double comm_s = 0;     // link busy time per step
  double exposed_s = 0;  // what compute could not hide
  double step_s = 0;     // compute + exposed
  double memory_bytes = 0;
  bool fits = false;
  std::string note;  // e.g. what hybrid degenerates to
};

struct TopoPlan {
  std::string topology;
  int gpus = 0;
  std::vector<std::vector<int>> islands;
  double ring_bandwidth_Bps = 0;
  std::string ring_bottleneck;
  double island_ring_bandwidth_Bps = 0;  // inside one island (0: islands of one GPU)
  double cross_ring_bandwidth_Bps = 0;   // between islands (0: one island)
  Workload workload;
  std::vector<StrategyCost> costs;  // in kAllStrategies order
  Strategy recommended = Strategy::DDP;
  std::string reason;

  const StrategyCost& cost(Strategy s) const;
};

// Ring collective times (alpha-beta), `bytes` = the full tensor size:
//   all-reduce: 2(n-1) steps of bytes/n; all-gather and reduce-scatter: (n-1) steps.
double all_reduce_s(double bytes, int n, double bandwidth_Bps, double hop_latency_s);
double all_gather_s(double bytes, int n, double bandwidth_Bps, double hop_latency_s);

TopoPlan plan_topology(const Topology& topo, const Workload& w);
// The recommendation rule, over the `allowed` strategies: the fastest that fits; among those
// within 5% of it, the one with the least memory (headroom for batch and activations is worth
// a few percent); when none fits, the one needing the least memory.
Strategy recommend(const std::vector<StrategyCost>& costs, std::span<const Strategy> allowed);
std::string format_topo_table(const TopoPlan& p);
nlohmann::json topo_json(const TopoPlan& p);

}  // namespace geoloco::planner

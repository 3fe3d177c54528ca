// What a device strategy holds per rank, by strategy (device_plan.hpp).
#include "trainer/loop/device_plan.hpp"

#include "core/error.hpp"
#include "trainer/loop/run_config.hpp"
#include "trainer/parallel/hybrid_shard.hpp"

namespace geoloco::trainer {

DeviceBufferPlan plan_device_buffers(StrategyKind kind, int64_t n, int rank, int ranks, int group_size) {
  GEOLOCO_CHECK(n > 0 && ranks >= 1 && rank >= 0 && rank < ranks, "bad plan: n {} rank {} of {}", n, rank, ranks);
  DeviceBufferPlan p;
  p.kind = kind;
  p.n = n;
  p.shard = shard_of(n, rank, ranks);
  p.mirror_elems = p.shard.count;
  p.grad_elems = n;
  switch (kind) {
    case StrategyKind::Ddp:
    case StrategyKind::Zero1:
      p.param_elems = n;
      p.grads_persistent = true;
      p.opt_begin = kind == StrategyKind::Ddp ? 0 : p.shard.offset;
      p.opt_end = kind == StrategyKind::Ddp ? n : p.shard.end();
      p.overlap = ranks > 1;
      break;
    case StrategyKind::Zero2:
    case StrategyKind::Fsdp:
      p.param_elems = kind == StrategyKind::Zero2 ? n : p.shard.count;
      p.grads_persistent = false;
      p.grad_shard_elems = p.shard.count;
      p.gathered_elems = kind == StrategyKind::Fsdp ? n : 0;
      p.opt_begin = p.shard.offset;
      p.opt_end = p.shard.end();
      p.overlap = false;
      break;
    case StrategyKind::Hybrid:
      p.param_elems = parallel::hybrid_shards(n, rank, ranks, group_size).held;
      p.grads_persistent = false;
      p.grad_shard_elems = p.shard.count;
      p.gathered_elems = n;
      p.opt_begin = p.shard.offset;
      p.opt_end = p.shard.end();
      p.overlap = false;
      break;
  }
  return p;
}

uint64_t DeviceBufferPlan::persistent_device_bytes() const {
  const int64_t e = param_elems + (grads_persistent ? grad_elems : 0) + grad_shard_elems + 2 * opt_elems();
  return static_cast<uint64_t>(e) * sizeof(float);
}

uint64_t DeviceBufferPlan::peak_device_bytes() const {
  // hybrid also holds its gradient pieces (as many as its parameters) between the two reductions.
  const int64_t held_grads = kind == StrategyKind::Hybrid ? param_elems : 0;
  const int64_t e = param_elems + grad_elems + grad_shard_elems + gathered_elems + 2 * opt_elems() + held_grads;
  return static_cast<uint64_t>(e) * sizeof(float);
}

nlohmann::json DeviceBufferPlan::to_json() const {
  const uint64_t f = sizeof(float);
  nlohmann::json j;
  j["param_bytes"] = static_cast<uint64_t>(param_elems) * f;
  j["grad_bytes"] = grads_persistent ? static_cast<uint64_t>(grad_elems) * f : 0;
  j["grad_shard_bytes"] = static_cast<uint64_t>(grad_shard_elems) * f;
  j["optimizer_bytes"] = static_cast<uint64_t>(2 * opt_elems()) * f;
  j["peak_transient_bytes"] = static_cast<uint64_t>((grads_persistent ? 0 : grad_elems) + gathered_elems) * f;
  j["pinned_mirror_bytes"] = static_cast<uint64_t>(mirror_elems) * f;
  j["device_persistent_bytes"] = persistent_device_bytes();
  j["device_peak_bytes"] = peak_device_bytes();
  j["grad_overlap"] = overlap;
  return j;
}

LocalRank local_rank_of(const RunConfig& cfg, int site, int rank) {
  const std::string me = cfg.sites.at(static_cast<size_t>(site)).node_key(rank);
  LocalRank lr{0, 0};
  for (size_t s = 0; s < cfg.sites.size(); ++s)
    for (int r = 0; r < cfg.sites[s].ranks; ++r) {
      if (cfg.sites[s].node_key(r) != me) continue;
      if (static_cast<int>(s) < site || (static_cast<int>(s) == site && r < rank)) ++lr.rank;
      ++lr.ranks;
    }
  return lr;
}

}  // namespace geoloco::trainer

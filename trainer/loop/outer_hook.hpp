// OuterHook: how the inner loop hands control to the outer (cross-site) loop without
// depending on it. The DiLoCo outer loop (outer_optimizer/) implements it.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "trainer/checkpoint/safetensors.hpp"
#include "trainer/loop/site_strategy.hpp"

namespace geoloco::trainer {

class OuterHook {
 public:
  virtual ~OuterHook() = default;
  // Called after inner step `step` (1-based) on every rank of every site. May overwrite
  // strategy.shard_params() and must then call strategy.shard_updated(). Returns true when
  // an outer step completed at this inner step (the trainer then logs/evaluates).
  virtual bool after_inner_step(int64_t step, SiteStrategy& strategy) = 0;
  // Called once after the last inner step (flushes in-flight syncs).
  virtual void finish(int64_t step, SiteStrategy& strategy) = 0;
  // Fields merged into each metrics line and into summary.json.
  virtual nlohmann::json metrics() = 0;
  virtual nlohmann::json summary() = 0;
  // Checkpoint: this rank's outer state as extra tensors/metadata (owned buffers).
  struct State {
    std::map<std::string, std::vector<float>> tensors;
    std::map<std::string, std::string> metadata;
  };
  virtual State save_state() = 0;
  virtual void restore_state(const SafetensorsFile& file) = 0;
};

}  // namespace geoloco::trainer

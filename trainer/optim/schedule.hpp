// Learning-rate schedules: linear warmup, then constant, linear or cosine decay to min_lr.
#pragma once

#include <cstdint>
#include <string>

#include "core/config_node.hpp"

namespace geoloco::trainer {

struct ScheduleConfig {
  std::string kind = "cosine";  // constant | linear | cosine
  int64_t warmup_steps = 0;     // lr ramps linearly from lr/warmup to lr over these steps
  double min_lr = 0.0;          // floor reached at the last step (linear, cosine)

  static ScheduleConfig from_yaml(const config::Node& node);
};

// lr at 0-based `step` of `total_steps` for peak rate `peak`:
//   step < warmup:  peak * (step + 1) / warmup
//   constant:       peak
//   linear/cosine:  min_lr + (peak - min_lr) * f(progress), progress = (step - warmup) / (total - warmup)
//                   f = 1 - progress (linear), 0.5 * (1 + cos(pi * progress)) (cosine)
double scheduled_lr(const ScheduleConfig& cfg, double peak, int64_t step, int64_t total_steps);

// A site that joined a running job at step `from` starts a fresh inner optimizer: its lr is
// the schedule's times this factor, a linear ramp over `steps` inner steps (docs/elastic.md,
// "Re-warmup"): (step - from + 1) / steps for from <= step < from + steps, else 1 (steps 0: 1).
double rewarm_factor(int64_t step, int64_t from, int64_t steps);

}  // namespace geoloco::trainer

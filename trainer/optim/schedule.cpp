#include "trainer/optim/schedule.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace geoloco::trainer {

ScheduleConfig ScheduleConfig::from_yaml(const config::Node& n) {
  ScheduleConfig c;
  c.kind = n.get_choice("kind", c.kind, {"constant", "linear", "cosine"});
  c.warmup_steps = n.get_int("warmup_steps", c.warmup_steps, 0, int64_t{1} << 40);
  c.min_lr = n.get_double("min_lr", c.min_lr, 0.0, 10.0);
  n.finish();
  return c;
}

double scheduled_lr(const ScheduleConfig& cfg, double peak, int64_t step, int64_t total_steps) {
  if (step < cfg.warmup_steps) return peak * static_cast<double>(step + 1) / static_cast<double>(cfg.warmup_steps);
  if (cfg.kind == "constant") return peak;
  const int64_t span = std::max<int64_t>(1, total_steps - cfg.warmup_steps);
  const double progress =
      std::clamp(static_cast<double>(step - cfg.warmup_steps) / static_cast<double>(span), 0.0, 1.0);
  const double f = cfg.kind == "linear" ? 1.0 - progress : 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
  return cfg.min_lr + (peak - cfg.min_lr) * f;
}

double rewarm_factor(int64_t step, int64_t from, int64_t steps) {
  if (steps <= 0 || step < from || step - from >= steps) return 1.0;
  return static_cast<double>(step - from + 1) / static_cast<double>(steps);
}

}  // namespace geoloco::trainer

// Outer optimizers on a shard of the global weights: SGD, Nesterov, Adam (outer_optimizer.hpp).
#include "outer_optimizer/outer_optimizer.hpp"

#include <cmath>

#include "core/error.hpp"

namespace geoloco::outer {

OuterOptimizer::OuterOptimizer(const OuterOptimizerConfig& cfg, size_t n) : cfg_(cfg) {
  if (cfg_.kind == OuterOptimizerKind::Adam) {
    a_.assign(n, 0.0f);
    b_.assign(n, 0.0f);
  } else if (cfg_.momentum > 0) {
    a_.assign(n, 0.0f);
  }
}

void OuterOptimizer::step(std::span<float> global, std::span<const float> delta) {
  GEOLOCO_CHECK_EQ(global.size(), delta.size(), "outer step: weights against deltas");
  ++t_;
  const int64_t n = static_cast<int64_t>(global.size());
  const float lr = static_cast<float>(cfg_.lr);
  float* __restrict p = global.data();
  const float* __restrict d = delta.data();
  if (cfg_.kind == OuterOptimizerKind::Adam) {
    const float b1 = static_cast<float>(cfg_.beta1), b2 = static_cast<float>(cfg_.beta2),
                eps = static_cast<float>(cfg_.eps);
    const float bc1 = static_cast<float>(1.0 - std::pow(cfg_.beta1, double(t_)));
    const float bc2 = static_cast<float>(1.0 - std::pow(cfg_.beta2, double(t_)));
    float* __restrict m = a_.data();
    float* __restrict v = b_.data();
    for (int64_t i = 0; i < n; ++i) {
      m[i] = b1 * m[i] + (1.0f - b1) * d[i];
      v[i] = b2 * v[i] + (1.0f - b2) * d[i] * d[i];
      p[i] -= lr * (m[i] / bc1) / (std::sqrt(v[i] / bc2) + eps);
    }
    return;
  }
  const float mu = static_cast<float>(cfg_.momentum);
  if (a_.empty()) {
    for (int64_t i = 0; i < n; ++i) p[i] -= lr * d[i];
    return;
  }
  float* __restrict buf = a_.data();
  if (cfg_.kind == OuterOptimizerKind::Nesterov) {
    for (int64_t i = 0; i < n; ++i) {
      buf[i] = mu * buf[i] + d[i];
      p[i] -= lr * (d[i] + mu * buf[i]);
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      buf[i] = mu * buf[i] + d[i];
      p[i] -= lr * buf[i];
    }
  }
}

}  // namespace geoloco::outer

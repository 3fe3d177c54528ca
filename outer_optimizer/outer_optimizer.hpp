// Outer optimizers: applied to the global weights with the averaged pseudo-gradient
// delta = global_before - local_after (a "gradient" pointing uphill), on one shard.
//
//   sgd       buf = momentum * buf + delta;  global -= lr * buf        (momentum 0: plain SGD)
//   nesterov  buf = momentum * buf + delta;  global -= lr * (delta + momentum * buf)
//             (torch.optim.SGD(nesterov=True) semantics; DiLoCo's default: lr 0.7, momentum 0.9)
//   adam      bias-corrected Adam on delta (an adaptive option), no weight decay
//   sparseloco  global -= lr * delta, no state: SparseLoCo's outer step, whose momentum is the
//             decayed error feedback of the sparsified pseudo-gradients (outer_config.hpp)
//
// Element-wise and in a fixed order: identical inputs give identical bits on every site.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "outer_optimizer/outer_config.hpp"

namespace geoloco::outer {

class OuterOptimizer {
 public:
  OuterOptimizer(const OuterOptimizerConfig& cfg, size_t elements);

  void step(std::span<float> global, std::span<const float> delta);

  int64_t steps() const { return t_; }
  void set_steps(int64_t t) { t_ = t; }
  // Optimizer state for checkpoints (momentum buffer, or Adam's m and v).
  std::span<float> state_a() { return a_; }
  std::span<float> state_b() { return b_; }
  size_t state_size() const { return a_.size() + b_.size(); }

 private:
  OuterOptimizerConfig cfg_;
  int64_t t_ = 0;
  std::vector<float> a_;  // momentum buffer / Adam m
  std::vector<float> b_;  // Adam v (empty otherwise)
};

}  // namespace geoloco::outer

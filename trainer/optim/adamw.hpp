// AdamW (Loshchilov & Hutter): decoupled weight decay, bias correction, fp32 moments.
// Matches torch.optim.AdamW: p *= 1 - lr*wd (decayed tensors only); m, v updated; then
// p -= lr * m_hat / (sqrt(v_hat) + eps).
//
// The optimizer owns moments for a contiguous range [begin, end) of the flat parameter
// buffer: the whole model under ddp, this rank's shard under zero1/zero2/fsdp.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "trainer/core/config_node.hpp"
#include "trainer/model/param_layout.hpp"

namespace geoloco::trainer {

struct AdamWConfig {
  double lr = 3.0e-4;       // peak learning rate (before schedule and batch scaling)
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1.0e-8;
  double weight_decay = 0.1;  // applied to 2-D weights (embeddings, linear), not to biases or LayerNorm

  static AdamWConfig from_yaml(const config::Node& node);
};

class AdamW {
 public:
  AdamW(const AdamWConfig& cfg, const ParamLayout& layout, int64_t begin, int64_t end);

  // One update of params[begin, end) from grads[begin, end) (full-buffer spans: the
  // optimizer indexes them with absolute offsets). `lr` is the scheduled rate for this step.
  void step(std::span<float> params, std::span<const float> grads, double lr);
  // The same update on shard-sized buffers: params[i] and grads[i] hold element begin + i.
  void step_shard(std::span<float> params, std::span<const float> grads, double lr);

  int64_t begin() const { return begin_; }
  int64_t end() const { return end_; }
  int64_t steps() const { return t_; }
  void set_steps(int64_t t) { t_ = t; }
  std::span<float> m() { return m_; }
  std::span<float> v() { return v_; }
  std::span<const float> m() const { return m_; }
  std::span<const float> v() const { return v_; }
  // Zeroes moments and the step count (outer loop option: reset inner state after a sync).
  void reset();

 private:
  struct Range {
    int64_t begin, end;  // absolute offsets
    bool decay;
  };
  AdamWConfig cfg_;
  int64_t begin_, end_;
  int64_t t_ = 0;
  std::vector<float> m_, v_;
  std::vector<Range> ranges_;  // the views intersected with [begin, end)

  // p, g point at element `begin_` of their buffers.
  void update(float* p, const float* g, double lr);
};

}  // namespace geoloco::trainer

// AdamW on the device with trainer::AdamW's exact semantics (trainer/optim/adamw.hpp): the
// same ranges with and without weight decay, the same float expression order, bias
// corrections computed in double and rounded to float. The kernel uses explicitly rounded
// float operations (no fused multiply-add), so on the same inputs it gives the CPU's bits.
// Moments are fp32 device buffers for [begin, end) of the flat layout.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>
#include <vector>

#include "trainer/cuda/handles.hpp"
#include "trainer/model/param_layout.hpp"
#include "trainer/optim/adamw.hpp"

namespace geoloco::cuda {

class CudaAdamW {
 public:
  CudaAdamW(const trainer::AdamWConfig& cfg, const trainer::ParamLayout& layout, int64_t begin, int64_t end);

  // params/grads: full-layout DEVICE spans (indexed with absolute offsets). Enqueued on s.
  void step(std::span<float> params, std::span<const float> grads, double lr, cudaStream_t s);
  // Shard-sized device spans: element i is element begin + i.
  void step_shard(std::span<float> params, std::span<const float> grads, double lr, cudaStream_t s);

  int64_t begin() const { return begin_; }
  int64_t end() const { return end_; }
  int64_t steps() const { return t_; }
  void set_steps(int64_t t) { t_ = t; }
  void reset(cudaStream_t s);
  // Moments to/from host (checkpoints); synchronous.
  void download(std::vector<float>& m, std::vector<float>& v) const;
  void upload(std::span<const float> m, std::span<const float> v);

 private:
  struct Range {
    int64_t begin, end;
    bool decay;
  };
  void update(float* p_at_begin, const float* g_at_begin, double lr, cudaStream_t s);

  trainer::AdamWConfig cfg_;
  int64_t begin_, end_, t_ = 0;
  DeviceBuffer<float> m_, v_;
  std::vector<Range> ranges_;
};

}  // namespace geoloco::cuda

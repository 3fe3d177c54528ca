// The inner optimizer on the device, trainer::InnerOptimizer's semantics
// (trainer/optim/inner_optimizer.hpp). AdamW: the same ranges with and without weight decay,
// the same float expression order, bias corrections computed in double and rounded to float;
// the kernel uses explicitly rounded float operations (no fused multiply-add), so on the same
// inputs it gives the CPU's bits. Muon (kind: muon): the momentum kernel gives the CPU's bits
// too; Newton-Schulz runs in fp32 through cuBLAS, whose summation order is not OpenBLAS's, so
// the matrices' updates agree with the CPU's to rounding, not bit for bit. A range that cuts a
// matrix gathers the momentum updates as the CPU optimizer does (`gather`, on device spans).
// Moments are fp32 device buffers for [begin, end) of the flat layout.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "trainer/cuda/handles.hpp"
#include "trainer/model/param_layout.hpp"
#include "trainer/optim/inner_optimizer.hpp"
#include "trainer/optim/muon.hpp"

namespace geoloco::cuda {

class CudaInnerOptimizer {
 public:
  CudaInnerOptimizer(const trainer::OptimizerConfig& cfg, const trainer::ParamLayout& layout, int64_t begin,
                     int64_t end);

  // Completes, in a full-layout DEVICE buffer, the Muon matrices the ranks' ranges cut (their
  // parts broadcast, trainer::muon_cut_parts; it synchronises `s` before the collective).
  // Collective: called by every rank at every step under Muon when given.
  using Gather = std::function<void(std::span<float> full)>;

  // params/grads: full-layout DEVICE spans (indexed with absolute offsets). Enqueued on s
  // (Muon synchronises s once per matrix, for the norm).
  void step(std::span<float> params, std::span<const float> grads, double lr, cudaStream_t s,
            const Gather& gather = {});
  // Shard-sized device spans: element i is element begin + i.
  void step_shard(std::span<float> params, std::span<const float> grads, double lr, cudaStream_t s,
                  const Gather& gather = {});
  bool needs_gather() const { return needs_gather_; }
  // Device bytes of the Muon step's scratch (update buffer, Newton-Schulz work space).
  uint64_t scratch_bytes() const { return (update_.size() + ns_.size()) * sizeof(float) + work_.size(); }

  const trainer::OptimizerConfig& config() const { return cfg_; }
  int64_t begin() const { return begin_; }
  int64_t end() const { return end_; }
  int64_t steps() const { return t_; }
  void set_steps(int64_t t) { t_ = t; }
  void reset(cudaStream_t s);
  // Moments to/from host (checkpoints); synchronous.
  void download(std::vector<float>& m, std::vector<float>& v) const;
  void upload(std::span<const float> m, std::span<const float> v);

 private:
  void update(float* p_at_begin, const float* g_at_begin, double lr, cudaStream_t s, const Gather& gather);
  // x (rows x cols, device) <- its Newton-Schulz orthogonalization (muon.hpp), on s.
  void newton_schulz(float* x, int64_t rows, int64_t cols, cudaStream_t s);

  trainer::OptimizerConfig cfg_;
  int64_t begin_, end_, total_, t_ = 0;
  DeviceBuffer<float> m_, v_;
  std::vector<trainer::OptimizerRange> ranges_;
  std::vector<trainer::MuonMatrix> muon_;  // the Muon matrices that intersect [begin, end)
  bool needs_gather_ = false;
  DeviceBuffer<float> update_;        // full layout, allocated at the first Muon step
  DeviceBuffer<float> ns_;            // A, B (m x m) and Y (rows x cols) of the largest matrix
  DeviceBuffer<unsigned char> work_;  // the norm's reduction scratch
  std::unique_ptr<CublasHandle> blas_;
};

}  // namespace geoloco::cuda

// CudaOuterStage: DeviceOuter (device_outer.hpp) on a CUDA site: each fragment's global weights
// and error-feedback residual in device memory, the round's pseudo-gradient and its
// quantization by trainer/cuda/quantize_kernel.hpp on the site's model stream, and only the
// scales and packed codes copied to pinned host memory. Built by CudaSiteStrategy, which gives
// it its shard (a device span), its stream and the collective part of shard_updated().
// Only in CUDA builds.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "trainer/cuda/handles.hpp"
#include "outer_optimizer/device_outer.hpp"

namespace geoloco::trainer {

class CudaOuterStage final : public outer::DeviceOuter {
 public:
  // shard: this rank's shard on the device (valid at every call); share: makes the site's
  // replica consistent after the shard was overwritten (collective).
  CudaOuterStage(std::function<std::span<float>()> shard, cudaStream_t stream, std::function<void()> share);

  void clear() override;
  void define(int index, const std::vector<outer::DeviceRun>& runs, std::span<const float> global,
              std::span<const float> residual) override;
  outer::StagedRound quantize(int index, compression::Codec codec, uint32_t block, float decay,
                              const std::vector<outer::DeviceSlice>& slices) override;
  void merge(int index, std::span<const float> global, float alpha) override;
  void residual(int index, std::span<float> out) override;
  uint64_t device_bytes() const override;

 private:
  struct Fragment {
    std::vector<outer::DeviceRun> runs;
    size_t n = 0;
    cuda::DeviceBuffer<float> global, residual;  // residual empty: no error feedback
    cuda::DeviceBuffer<uint8_t> packed;          // the round's scales and codes, slice after slice
    cuda::PinnedBuffer<uint8_t> host;            // their copy on the host
  };
  Fragment& at(int index);
  // Grows the shared round scratch to hold a fragment of n elements, `slices` slices of at
  // most `groups` blocks, and its corrected values under error feedback.
  void reserve_scratch(size_t n, size_t slices, size_t groups, bool ef);

  std::function<std::span<float>()> shard_;
  cudaStream_t stream_;
  std::function<void()> share_;
  std::vector<std::unique_ptr<Fragment>> frags_;
  // Shared by the fragments: quantize() runs one fragment at a time and returns when done.
  cuda::DeviceBuffer<float> delta_, corrected_, inv_;
  cuda::DeviceBuffer<uint8_t> q_;
  cuda::DeviceBuffer<double> partial_;
  cuda::PinnedBuffer<double> host_partial_;
};

}  // namespace geoloco::trainer

// Helpers for the device tests: skipping without a GPU, moving float test data to and from
// device buffers of the activation type, and the parity log (written as parity.json into
// $GEOLOCO_GPU_REPORT_DIR by tools/gpu_check.sh).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/rng.hpp"
#include "trainer/cuda/bf16.hpp"
#include "trainer/cuda/device.hpp"
#include "trainer/cuda/handles.hpp"
#include "trainer/cuda/ops.hpp"
#include "trainer/cuda/tolerance.hpp"

namespace geoloco::cuda::testing {

#define GEOLOCO_REQUIRE_GPU()                                                          \
  do {                                                                                 \
    const std::string why_ = ::geoloco::cuda::no_device_reason();                      \
    if (!why_.empty()) GTEST_SKIP() << "no usable GPU, device test skipped: " << why_; \
    ::geoloco::cuda::select_device(0, 1);                                              \
  } while (0)

inline std::vector<float> random_vec(size_t n, uint64_t seed, double scale = 1.0) {
  Rng r(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(scale * r.normal());
  return v;
}

// What the device will hold: bf16 inputs are rounded once so both sides see the same values.
inline std::vector<float> as_precision(std::vector<float> v, Precision p) {
  if (p == Precision::Bf16)
    for (auto& x : v) x = round_to_bf16(x);
  return v;
}

template <class A>
DeviceBuffer<A> to_device(const std::vector<float>& v) {
  DeviceBuffer<A> d(v.size(), "test data");
  if constexpr (std::is_same_v<A, float>) {
    check_cuda(cudaMemcpy(d.data(), v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice), "test upload");
  } else {
    std::vector<uint16_t> bits(v.size());
    floats_to_bf16(v, bits);
    check_cuda(cudaMemcpy(d.data(), bits.data(), bits.size() * 2, cudaMemcpyHostToDevice), "test upload");
  }
  // A pageable cudaMemcpy may return before its DMA lands, and the ops run on non-blocking
  // streams that do not order after the legacy stream: wait here.
  check_cuda(cudaDeviceSynchronize(), "test upload");
  return d;
}

template <class A>
std::vector<float> to_host(const DeviceBuffer<A>& d) {
  check_cuda(cudaDeviceSynchronize(), "test synchronize");
  std::vector<float> v(d.size());
  if constexpr (std::is_same_v<A, float>) {
    check_cuda(cudaMemcpy(v.data(), d.data(), v.size() * sizeof(float), cudaMemcpyDeviceToHost), "test download");
  } else {
    std::vector<uint16_t> bits(d.size());
    check_cuda(cudaMemcpy(bits.data(), d.data(), bits.size() * 2, cudaMemcpyDeviceToHost), "test download");
    bf16_to_floats(bits, v);
  }
  return v;
}

inline DeviceBuffer<int32_t> ids_to_device(const std::vector<int32_t>& v) {
  DeviceBuffer<int32_t> d(v.size(), "test ids");
  check_cuda(cudaMemcpy(d.data(), v.data(), v.size() * 4, cudaMemcpyHostToDevice), "test upload ids");
  check_cuda(cudaDeviceSynchronize(), "test upload ids");
  return d;
}

// Records one comparison (for parity.json) and returns whether it is within tolerance.
bool record_parity(const std::string& op, Precision p, const std::string& tensor, const ErrorStats& s);

}  // namespace geoloco::cuda::testing

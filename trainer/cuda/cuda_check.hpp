// Turns cudaError_t / cublasStatus_t into the typed errors of cuda_error.hpp, naming the
// operation and the current device. Only for code built with the CUDA toolkit.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <string_view>

#include "trainer/cuda/cuda_error.hpp"

namespace geoloco::cuda {

int current_device_or_minus1();

[[noreturn]] void raise_cuda(cudaError_t e, std::string_view op);
[[noreturn]] void raise_cublas(cublasStatus_t s, std::string_view op);

inline void check_cuda(cudaError_t e, std::string_view op) {
  if (e != cudaSuccess) [[unlikely]]
    raise_cuda(e, op);
}
inline void check_cublas(cublasStatus_t s, std::string_view op) {
  if (s != CUBLAS_STATUS_SUCCESS) [[unlikely]]
    raise_cublas(s, op);
}
// After a kernel launch: reports a bad launch configuration or a missing kernel image
// (architecture mismatch) at the launch site instead of at the next synchronisation.
inline void check_launch(std::string_view op) { check_cuda(cudaGetLastError(), op); }

}  // namespace geoloco::cuda

// Launchers of Muon's elementwise kernels (internal to CudaInnerOptimizer); the Newton-Schulz
// products go through cuBLAS (ops.hpp's gemm). Local indices [lo, hi) as in adamw_kernel.hpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace geoloco::cuda {

// m = mu m + (1 - mu) g;  u = nesterov ? (1 - mu) g + mu m : m   (trainer::InnerOptimizer's bits)
void launch_muon_momentum(unsigned grid, cudaStream_t s, const float* g, float* m, float* u, int64_t lo, int64_t hi,
                          float mu, bool nesterov);
// p = p * keep - step * o
void launch_muon_apply(unsigned grid, cudaStream_t s, float* p, const float* o, int64_t lo, int64_t hi, float keep,
                       float step);
// y = a * x  (n elements)
void launch_scaled_copy(unsigned grid, cudaStream_t s, float* y, const float* x, int64_t n, float a);

}  // namespace geoloco::cuda

// Launcher of the AdamW kernel (internal to CudaInnerOptimizer). p, g point at the range's element 0
// of the parameter/gradient buffers as seen by m and v; updates local indices [lo, hi).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace geoloco::cuda {

void launch_adamw(unsigned grid, cudaStream_t s, float* p, const float* g, float* m, float* v, int64_t lo, int64_t hi,
                  float b1, float b2, float bc1, float bc2, float lr, float eps, float keep);

}  // namespace geoloco::cuda

// The AdamW update kernel (kept apart from the host code so nvcc never sees fmt).
#include "trainer/cuda/adamw_kernel.hpp"
#include "trainer/cuda/kernel_lang.hpp"

namespace geoloco::cuda {

// Mirrors trainer::AdamW::update term by term; __f*_rn keep nvcc from contracting into FMAs
// (the CPU build compiles in ISO mode, where GCC does not contract either).
__global__ void adamw_k(float* p, const float* g, float* m, float* v, int64_t lo, int64_t hi, float b1, float b2,
                        float bc1, float bc2, float lr, float eps, float keep) {
  const float one_b1 = __fsub_rn(1.0f, b1), one_b2 = __fsub_rn(1.0f, b2);
  for (int64_t i = lo + blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < hi; i += int64_t(gridDim.x) * blockDim.x) {
    const float gi = g[i];
    const float mi = __fadd_rn(__fmul_rn(b1, m[i]), __fmul_rn(one_b1, gi));
    const float vi = __fadd_rn(__fmul_rn(b2, v[i]), __fmul_rn(__fmul_rn(one_b2, gi), gi));
    m[i] = mi;
    v[i] = vi;
    const float mhat = __fdiv_rn(mi, bc1);
    const float vhat = __fdiv_rn(vi, bc2);
    p[i] = __fsub_rn(__fmul_rn(p[i], keep), __fdiv_rn(__fmul_rn(lr, mhat), __fadd_rn(__fsqrt_rn(vhat), eps)));
  }
}


void launch_adamw(unsigned grid, cudaStream_t s, float* p, const float* g, float* m, float* v, int64_t lo, int64_t hi,
                  float b1, float b2, float bc1, float bc2, float lr, float eps, float keep) {
  GEOLOCO_LAUNCH(adamw_k, grid, 256, 0, s)(p, g, m, v, lo, hi, b1, b2, bc1, bc2, lr, eps, keep);
}

}  // namespace geoloco::cuda

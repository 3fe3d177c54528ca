// Muon's elementwise kernels (kept apart from the host code so nvcc never sees fmt). Rounded
// float operations (__f*_rn, no FMA) as in adamw_kernel.cu: the momentum is the CPU's bits.
#include "trainer/cuda/kernel_lang.hpp"
#include "trainer/cuda/muon_kernel.hpp"

namespace geoloco::cuda {

__global__ void muon_momentum_k(const float* g, float* m, float* u, int64_t lo, int64_t hi, float mu, bool nesterov) {
  const float one_mu = __fsub_rn(1.0f, mu);
  for (int64_t i = lo + blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < hi; i += int64_t(gridDim.x) * blockDim.x) {
    const float gi = g[i];
    const float mi = __fadd_rn(__fmul_rn(mu, m[i]), __fmul_rn(one_mu, gi));
    m[i] = mi;
    u[i] = nesterov ? __fadd_rn(__fmul_rn(one_mu, gi), __fmul_rn(mu, mi)) : mi;
  }
}

__global__ void muon_apply_k(float* p, const float* o, int64_t lo, int64_t hi, float keep, float step) {
  for (int64_t i = lo + blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < hi; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = __fsub_rn(__fmul_rn(p[i], keep), __fmul_rn(step, o[i]));
}

__global__ void scaled_copy_k(float* y, const float* x, int64_t n, float a) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = __fmul_rn(a, x[i]);
}

void launch_muon_momentum(unsigned grid, cudaStream_t s, const float* g, float* m, float* u, int64_t lo, int64_t hi,
                          float mu, bool nesterov) {
  GEOLOCO_LAUNCH(muon_momentum_k, grid, 256, 0, s)(g, m, u, lo, hi, mu, nesterov);
}

void launch_muon_apply(unsigned grid, cudaStream_t s, float* p, const float* o, int64_t lo, int64_t hi, float keep,
                       float step) {
  GEOLOCO_LAUNCH(muon_apply_k, grid, 256, 0, s)(p, o, lo, hi, keep, step);
}

void launch_scaled_copy(unsigned grid, cudaStream_t s, float* y, const float* x, int64_t n, float a) {
  GEOLOCO_LAUNCH(scaled_copy_k, grid, 256, 0, s)(y, x, n, a);
}

}  // namespace geoloco::cuda

// Quantization kernels (quantize_kernel.hpp). Each mirrors compression/values.cpp operation
// by operation with explicitly rounded float operations (no contraction), so the scales and
// codes are the CPU codec's bits: a group's scale by one thread in the CPU's order (absmax
// over the bit patterns; int2's mean |x| over 8 fixed partial sums), then one thread per code.
#include "trainer/cuda/kernel_lang.hpp"
#include "trainer/cuda/quantize_kernel.hpp"

namespace geoloco::cuda {

namespace {

__device__ __forceinline__ uint32_t bits_of(float f) {
#if defined(__CUDACC__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

__device__ __forceinline__ float float_of(uint32_t u) {
#if defined(__CUDACC__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

__device__ __forceinline__ float abs_of(float x) { return float_of(bits_of(x) & 0x7fffffffu); }
__device__ __forceinline__ bool finite(float x) { return (bits_of(x) & 0x7f800000u) != 0x7f800000u; }
// Round to nearest even for |y| < 2^22 (values.cpp's round_even).
__device__ __forceinline__ float round_even(float y) { return __fsub_rn(__fadd_rn(y, 0x1.8p23f), 0x1.8p23f); }

constexpr float kInt2MeanFactor = 0.75f;  // compression::kInt2MeanFactor

template <QuantCodec C>
__device__ __forceinline__ float qmax() {
  if constexpr (C == QuantCodec::kInt8) return 127.0f;
  if constexpr (C == QuantCodec::kInt4) return 7.0f;
  if constexpr (C == QuantCodec::kInt2) return 3.0f;
  return 1.0f;
}

template <QuantCodec C>
__global__ void scale_k(const float* x, int64_t n, int64_t group, float* scales, float* inv) {
  const int64_t groups = (n + group - 1) / group;
  for (int64_t g = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; g < groups; g += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b = g * group, len = n - b < group ? n - b : group;
    const float* xg = x + b;
    float s, iv;
    if constexpr (C == QuantCodec::kInt2) {
      // values.cpp's mean_abs: element i into partial sum i % 8. The lane loops unroll, so
      // the partial sums stay in registers.
      float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      int64_t i = 0;
      for (; i + 8 <= len; i += 8) {
        GEOLOCO_UNROLL
        for (int l = 0; l < 8; ++l) part[l] = __fadd_rn(part[l], abs_of(xg[i + l]));
      }
      GEOLOCO_UNROLL
      for (int l = 0; l < 8; ++l)
        if (i + l < len) part[l] = __fadd_rn(part[l], abs_of(xg[i + l]));
      const float sum = __fadd_rn(__fadd_rn(__fadd_rn(part[0], part[1]), __fadd_rn(part[2], part[3])),
                                  __fadd_rn(__fadd_rn(part[4], part[5]), __fadd_rn(part[6], part[7])));
      s = __fmul_rn(kInt2MeanFactor, __fdiv_rn(sum, static_cast<float>(len)));
      iv = __fdiv_rn(1.0f, s);
    } else {
      uint32_t m = 0;
      for (int64_t i = 0; i < len; ++i) {
        const uint32_t u = bits_of(xg[i]) & 0x7fffffffu;
        m = u > m ? u : m;
      }
      const float a = float_of(m);
      iv = __fdiv_rn(qmax<C>(), a);
      s = __fdiv_rn(a, qmax<C>());
    }
    scales[g] = s;
    inv[g] = iv;
  }
}

template <QuantCodec C>
__global__ void code_k(const float* x, int64_t n, int64_t group, const float* scales, const float* inv, uint8_t* q) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t g = i / group;
    float s = scales[g], iv = inv[g];
    bool divide = false;
    if (s == 0.0f) {
      iv = 0.0f;  // all zero, or a scale that underflowed: every code reconstructs to 0
      s = 1.0f;
    } else if (!finite(iv)) {
      divide = true;  // 1/s overflows (a tiny subnormal scale): x / s
    }
    const float xi = x[i];
    if constexpr (C == QuantCodec::kFp4) {
      const float y = divide ? __fdiv_rn(abs_of(xi), s) : __fmul_rn(abs_of(xi), iv);
      const float t = __fmul_rn(y, 4.0f / 3.0f);
      int32_t m = static_cast<int32_t>(bits_of(t) >> 23) - 120;
      m = m > 7 ? 7 : m;
      const int32_t low = y >= 0x1p-7f ? 1 : 0;
      m = m >= 1 ? m : low;
      const int32_t sign = ((bits_of(xi) >> 31) != 0 && m != 0) ? 8 : 0;
      q[i] = static_cast<uint8_t>(m | sign);
    } else {
      const float y = divide ? __fdiv_rn(xi, s) : __fmul_rn(xi, iv);
      if constexpr (C == QuantCodec::kInt8) {
        int32_t v = static_cast<int32_t>(round_even(y));
        v = v > 127 ? 127 : (v < -127 ? -127 : v);
        q[i] = static_cast<uint8_t>(v);
      } else if constexpr (C == QuantCodec::kInt4) {
        int32_t v = static_cast<int32_t>(round_even(y));
        v = v > 7 ? 7 : (v < -7 ? -7 : v);
        q[i] = static_cast<uint8_t>(v + 8);
      } else {
        float t = __fadd_rn(__fmul_rn(y, 0.5f), 1.5f);
        t = t < 0.0f ? 0.0f : t;  // std::max(t, 0.0f)
        t = 3.0f < t ? 3.0f : t;  // std::min(t, 3.0f)
        q[i] = static_cast<uint8_t>(static_cast<int32_t>(round_even(t)));
      }
    }
  }
}

// One output byte per thread: 1 code of 8 bits, 2 of 4 or 4 of 2, low bits first.
__global__ void pack_k(const uint8_t* q, int64_t n, int bits, uint8_t* out) {
  const int64_t per = 8 / bits, bytes = (n * bits + 7) / 8;
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < bytes; j += int64_t(gridDim.x) * blockDim.x) {
    uint32_t b = 0;
    for (int64_t k = 0; k < per && j * per + k < n; ++k) b |= uint32_t(q[j * per + k]) << (bits * k);
    out[j] = static_cast<uint8_t>(b);
  }
}

__global__ void ef_correct_k(const float* v, const float* r, float beta, bool decay, float* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = decay ? __fadd_rn(v[i], __fmul_rn(beta, r[i])) : __fadd_rn(v[i], r[i]);
}

// The decoded value of code q with scale s (values.cpp's dequantize_int8 / dequantize_small).
template <QuantCodec C>
__device__ __forceinline__ float level(uint8_t q, float s) {
  if constexpr (C == QuantCodec::kInt8) {
    return __fmul_rn(static_cast<float>(static_cast<int8_t>(q)), s);
  } else if constexpr (C == QuantCodec::kInt4) {
    return __fmul_rn(static_cast<float>(int32_t(q) - 8), s);
  } else if constexpr (C == QuantCodec::kInt2) {
    return __fmul_rn(static_cast<float>(2 * int32_t(q) - 3), s);
  } else {
    const uint32_t m = q & 7u;
    const uint32_t mag = m != 0 ? (m + 120u) << 23 : 0u;
    const uint32_t sign = uint32_t(q & 8u) << 28;
    return __fmul_rn(float_of(mag | sign), s);
  }
}

template <QuantCodec C>
__global__ void ef_residual_k(const float* x, const float* scales, const uint8_t* q, int64_t n, int64_t group,
                              float* r) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    r[i] = __fsub_rn(x[i], level<C>(q[i], scales[i / group]));
}

__global__ void pseudo_gradient_k(const float* g, const float* x, float* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = __fsub_rn(g[i], x[i]);
}

__global__ void merge_k(float* x, const float* g, float a, float b, bool copy, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = copy ? g[i] : __fadd_rn(__fmul_rn(a, x[i]), __fmul_rn(b, g[i]));
}

constexpr int kErrorThreads = 256;

// One block's three sums, tree-reduced in shared memory (doubles: the figures are diagnostics,
// their order need not match the host's).
template <QuantCodec C>
__global__ void error_partials_k(const float* delta, const float* corrected, const float* scales, const uint8_t* q,
                                 int64_t n, int64_t group, double* partial) {
  __shared__ double sh[3 * kErrorThreads];
  double e2 = 0, r2 = 0, bad = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const double d = delta[i];
    const double e = double(level<C>(q[i], scales[i / group])) - d;
    e2 += e * e;
    r2 += d * d;
    const float c = corrected[i];
    if (!finite(c) || abs_of(c) > 0x1p64f) bad += 1;
  }
  const int t = threadIdx.x;
  sh[t] = e2;
  sh[kErrorThreads + t] = r2;
  sh[2 * kErrorThreads + t] = bad;
  __syncthreads();
  for (int w = kErrorThreads / 2; w > 0; w /= 2) {
    if (t < w)
      for (int k = 0; k < 3; ++k) sh[k * kErrorThreads + t] += sh[k * kErrorThreads + t + w];
    __syncthreads();
  }
  if (t == 0)
    for (int k = 0; k < 3; ++k) partial[3 * blockIdx.x + k] = sh[k * kErrorThreads];
}

unsigned grid_for(int64_t items) {
  const int64_t blocks = (items + 255) / 256;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > 4096 ? 4096 : blocks));
}

template <QuantCodec C>
void quantize_as(const float* x, int64_t n, int64_t group, float* scales, uint8_t* codes, float* inv, uint8_t* q,
                 cudaStream_t s) {
  const int64_t groups = (n + group - 1) / group;
  GEOLOCO_LAUNCH(scale_k<C>, grid_for(groups), 256, 0, s)(x, n, group, scales, inv);
  // One byte per code in q (kept for the residual), then packed (int8: copied) into codes.
  GEOLOCO_LAUNCH(code_k<C>, grid_for(n), 256, 0, s)(x, n, group, scales, inv, q);
  const int bits = C == QuantCodec::kInt8 ? 8 : (C == QuantCodec::kInt2 ? 2 : 4);
  GEOLOCO_LAUNCH(pack_k, grid_for((n * bits + 7) / 8), 256, 0, s)(q, n, bits, codes);
}

template <QuantCodec C>
void residual_as(const float* x, const float* scales, const uint8_t* q, int64_t n, int64_t group, float* r,
                 cudaStream_t s) {
  GEOLOCO_LAUNCH(ef_residual_k<C>, grid_for(n), 256, 0, s)(x, scales, q, n, group, r);
}

struct ErrorArgs {
  const float *delta, *corrected, *scales;
  const uint8_t* q;
  int64_t n, group;
  double* partial;
};

template <QuantCodec C>
void error_partials_as(const ErrorArgs& a, cudaStream_t s) {
  GEOLOCO_LAUNCH(error_partials_k<C>, kErrorBlocks, kErrorThreads, 0, s)
  (a.delta, a.corrected, a.scales, a.q, a.n, a.group, a.partial);
}

}  // namespace

void launch_pseudo_gradient(const float* global, const float* local, float* out, size_t n, cudaStream_t s) {
  if (n == 0) return;
  const auto N = static_cast<int64_t>(n);
  GEOLOCO_LAUNCH(pseudo_gradient_k, grid_for(N), 256, 0, s)(global, local, out, N);
}

void launch_merge(float* local, const float* global, float alpha, bool copy, size_t n, cudaStream_t s) {
  if (n == 0) return;
  const auto N = static_cast<int64_t>(n);
  GEOLOCO_LAUNCH(merge_k, grid_for(N), 256, 0, s)(local, global, alpha, 1.0f - alpha, copy, N);
}

void launch_error_partials(QuantCodec c, const float* delta, const float* corrected, const float* scales,
                           const uint8_t* q, size_t n, size_t group, double* partial, cudaStream_t s) {
  const ErrorArgs a{delta, corrected, scales, q, static_cast<int64_t>(n), static_cast<int64_t>(group), partial};
  switch (c) {
    case QuantCodec::kInt8: error_partials_as<QuantCodec::kInt8>(a, s); return;
    case QuantCodec::kInt4: error_partials_as<QuantCodec::kInt4>(a, s); return;
    case QuantCodec::kFp4: error_partials_as<QuantCodec::kFp4>(a, s); return;
    case QuantCodec::kInt2: error_partials_as<QuantCodec::kInt2>(a, s); return;
  }
}

ErrorSums sum_error_partials(const double* partial) {
  ErrorSums out;
  for (unsigned b = 0; b < kErrorBlocks; ++b) {
    out.err2 += partial[3 * b];
    out.ref2 += partial[3 * b + 1];
    out.refused += partial[3 * b + 2];
  }
  return out;
}

int quant_bits(QuantCodec c) {
  switch (c) {
    case QuantCodec::kInt8: return 8;
    case QuantCodec::kInt4:
    case QuantCodec::kFp4: return 4;
    case QuantCodec::kInt2: return 2;
  }
  return 8;
}

void launch_quantize(QuantCodec c, const float* x, size_t n, size_t group, float* scales, uint8_t* codes, float* inv,
                     uint8_t* q, cudaStream_t s) {
  if (n == 0) return;
  const auto N = static_cast<int64_t>(n), G = static_cast<int64_t>(group);
  switch (c) {
    case QuantCodec::kInt8: quantize_as<QuantCodec::kInt8>(x, N, G, scales, codes, inv, q, s); return;
    case QuantCodec::kInt4: quantize_as<QuantCodec::kInt4>(x, N, G, scales, codes, inv, q, s); return;
    case QuantCodec::kFp4: quantize_as<QuantCodec::kFp4>(x, N, G, scales, codes, inv, q, s); return;
    case QuantCodec::kInt2: quantize_as<QuantCodec::kInt2>(x, N, G, scales, codes, inv, q, s); return;
  }
}

void launch_ef_correct(const float* values, const float* residual, float beta, float* corrected, size_t n,
                       cudaStream_t s) {
  if (n == 0) return;
  const auto N = static_cast<int64_t>(n);
  GEOLOCO_LAUNCH(ef_correct_k, grid_for(N), 256, 0, s)(values, residual, beta, beta < 1.0f, corrected, N);
}

void launch_ef_residual(QuantCodec c, const float* corrected, const float* scales, const uint8_t* q, size_t n,
                        size_t group, float* residual, cudaStream_t s) {
  if (n == 0) return;
  const auto N = static_cast<int64_t>(n), G = static_cast<int64_t>(group);
  switch (c) {
    case QuantCodec::kInt8: residual_as<QuantCodec::kInt8>(corrected, scales, q, N, G, residual, s); return;
    case QuantCodec::kInt4: residual_as<QuantCodec::kInt4>(corrected, scales, q, N, G, residual, s); return;
    case QuantCodec::kFp4: residual_as<QuantCodec::kFp4>(corrected, scales, q, N, G, residual, s); return;
    case QuantCodec::kInt2: residual_as<QuantCodec::kInt2>(corrected, scales, q, N, G, residual, s); return;
  }
}

}  // namespace geoloco::cuda

// Branch-free float exp and tanh that the compiler can vectorize inside `omp simd` loops
// (libm's expf/tanhf are scalar calls unless -ffast-math, which we do not want: it would
// change NaN handling and reassociate everything). Accuracy: exp_fast within ~2 ulp of
// expf over [-87, 88] (inputs outside are clamped: exp_fast(-1000) is ~1e-38, not 0,
// which is harmless where it is used, in softmax numerators next to a 1); tanh_fast within
// ~1e-7 absolute. Pure functions of their input: the same bits on every thread count.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

// The rounding trick in exp_fast needs IEEE semantics: -ffast-math would fold it away.
#ifdef __FAST_MATH__
#error "trainer/model/fast_math.hpp must not be compiled with -ffast-math"
#endif

namespace geoloco::trainer::fastmath {

inline float exp_fast(float x) {
  x = std::min(std::max(x, -87.0f), 88.0f);  // min/max, not branches: keeps loops vectorized
  // x = n ln2 + r, |r| <= ln2/2; ln2 split in a short high part (exact product) and a low part.
  // Round to nearest by adding and removing 1.5 * 2^23 (std::floor does not vectorize
  // with GCC 12 here; this does, and IEEE semantics keep the compiler from folding it).
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  // Minimax polynomial for (e^r - 1 - r) / r^2 on that interval (Cephes coefficients).
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float er = p * (r * r) + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  return er * std::bit_cast<float>(bits);
}

inline float tanh_fast(float x) {
  // tanh(x) = 1 - 2 / (e^{2x} + 1): saturates correctly to +-1 through the clamp in exp_fast.
  return 1.0f - 2.0f / (exp_fast(2.0f * x) + 1.0f);
}

}  // namespace geoloco::trainer::fastmath

// bfloat16 <-> float on the host, bit-exact with CUDA's __float2bfloat16 (round to nearest,
// ties to even; NaN stays a quiet NaN) and __bfloat162float. Used to build bf16 inputs for
// the parity tests and to read bf16 device buffers back; no CUDA headers needed.
#pragma once

#include <bit>
#include <cstdint>
#include <span>

namespace geoloco::cuda {

inline uint16_t float_to_bf16_bits(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  // Adding 0x7fff plus the lowest kept bit rounds to nearest with ties to even; an overflow
  // into the exponent is the correct rounding up (to the next binade or to infinity).
  const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

inline float bf16_bits_to_float(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

// The float nearest to f that bf16 can represent (what a bf16 store then load gives).
inline float round_to_bf16(float f) { return bf16_bits_to_float(float_to_bf16_bits(f)); }

inline void floats_to_bf16(std::span<const float> in, std::span<uint16_t> out) {
  for (size_t i = 0; i < in.size() && i < out.size(); ++i) out[i] = float_to_bf16_bits(in[i]);
}
inline void bf16_to_floats(std::span<const uint16_t> in, std::span<float> out) {
  for (size_t i = 0; i < in.size() && i < out.size(); ++i) out[i] = bf16_bits_to_float(in[i]);
}

}  // namespace geoloco::cuda

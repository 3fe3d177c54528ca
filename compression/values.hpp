// Value codec kernels: dense float values <-> (per-group fp32 scales, bit-packed codes).
//
// Values are cut into groups of `group` elements (the last group may be shorter). Without
// top-k a group is a block; with top-k it is the values one block kept. Scaled codecs store
// one fp32 scale per group; codes are packed back to back, element i at bit i * bits, low
// bits first, and padding bits of the last byte are zero.
//
// Reconstruction and its error bound (per element, s = the group's scale, a = group absmax):
//   fp32: exact.  fp16/bf16: round to nearest even (relative 2^-11 / 2^-8).
//   int8: s = a/127, x^ = q*s, |x - x^| <= s/2.   int4: s = a/7, |x - x^| <= s/2.
//   int2: s = 0.75 * mean|x| (absmax scaling of heavy-tailed data would put most values on
//         +-a/3), x^ in {-3,-1,1,3}*s, |x - x^| <= max(s, |x| - 3s) (beyond 3s it clips).
//   fp4:  s = a, |x^| in {0} u {2^-6..2^0}*s, |x - x^| <= max(|x|/3, s*2^-7).
// (plus float rounding of x/s and q*s: a few ulps of |x|, and 2^-149-scale slack when s is
// subnormal; see tests/compression/test_values.cpp.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "compression/codec.hpp"

namespace geoloco::compression {

// Every value on the wire is finite and within this magnitude; the encoder rejects larger
// inputs (a pseudo-gradient of 2^64 means the site diverged) and the decoder rejects larger
// scales, so a decoded product q * s can never overflow.
inline constexpr float kMaxAbsValue = 0x1p64f;
// int2 scale = this * mean |x| of the group (minimises the relative L2 error of Student-t
// like data among the factors tried: 0.3 .. 1.0; see docs/compression.md).
inline constexpr float kInt2MeanFactor = 0.75f;

// Encodes x (all finite, |x| <= kMaxAbsValue: caller checks) into `scales` (groups x f32,
// little-endian, scaled codecs only) and `codes` (ceil(n*bits/8) bytes).
// `scratch` is reused between calls. Throws EncodeError when a value does not fit fp16.
void encode_values(Codec codec, std::span<const float> x, size_t group, uint8_t* scales, uint8_t* codes,
                   std::vector<uint8_t>& scratch);

// Decodes n values. Throws FrameError(kPayload) for a scale that is negative, non-finite or
// above kMaxAbsValue, a code the encoder never emits (int8 -128, int4 0b0000 == -8, fp4
// negative zero), a non-finite fp16/bf16/fp32 value, or non-zero padding bits.
void decode_values(Codec codec, const uint8_t* scales, const uint8_t* codes, size_t n, size_t group,
                   float* out, std::vector<uint8_t>& scratch);

}  // namespace geoloco::compression

// IEEE binary16 conversions in portable integer code (round to nearest even), used where
// F16C is not available and for the scalar tails of the F16C loops. Not every compiler we
// build with has _Float16 on x86 (clang 14 does not), and the frame format must decode to
// the same bits everywhere, so the conversion is spelled out here.
#pragma once

#include <bit>
#include <cstdint>

namespace geoloco::compression {

constexpr uint16_t half_from_float(float x) {
  const uint32_t f = std::bit_cast<uint32_t>(x);
  const uint16_t sign = static_cast<uint16_t>((f >> 16) & 0x8000u);
  const uint32_t a = f & 0x7fffffffu;
  if (a >= 0x7f800000u) return sign | (a > 0x7f800000u ? 0x7e00 : 0x7c00);  // NaN, inf
  if (a >= 0x477ff000u) return sign | 0x7c00;                                // >= 65520: inf
  if (a >= 0x38800000u) {                                                    // normal half
    uint32_t r = a - (112u << 23);                                           // rebias 127 -> 15
    r += 0x0fffu + ((r >> 13) & 1u);
    return sign | static_cast<uint16_t>(r >> 13);
  }
  if (a < 0x33000000u) return sign;  // below 2^-25 (2^-25 itself ties to even: 0)
  // Subnormal half: units of 2^-24. a = m * 2^(e - 150) with the implicit bit in m.
  const uint32_t e = a >> 23;
  const uint32_t m = (a & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - e;  // 14..24
  uint32_t h = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u);
  const uint32_t halfway = 1u << (shift - 1u);
  if (rem > halfway || (rem == halfway && (h & 1u))) ++h;
  return sign | static_cast<uint16_t>(h);
}

constexpr float float_from_half(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu;
  const uint32_t m = h & 0x3ffu;
  if (e == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (m << 13));
  if (e == 0) {
    // Subnormal (or zero): m * 2^-24 is exact in float.
    return std::bit_cast<float>(sign | std::bit_cast<uint32_t>(static_cast<float>(m) * 0x1p-24f));
  }
  return std::bit_cast<float>(sign | ((e + 112u) << 23) | (m << 13));
}

}  // namespace geoloco::compression

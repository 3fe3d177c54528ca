// The portable fp16 conversions against the hardware (F16C) for every half and a sweep of
// floats: the fp16 codec must produce the same bits with or without F16C.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>

#include "compression/half.hpp"
#include "core/rng.hpp"
#ifdef __F16C__
#include <immintrin.h>
#endif

using namespace geoloco;
using namespace geoloco::compression;

TEST(Half, KnownValues) {
  EXPECT_EQ(half_from_float(1.0f), 0x3c00);
  EXPECT_EQ(half_from_float(-2.0f), 0xc000);
  EXPECT_EQ(half_from_float(65504.0f), 0x7bff);
  EXPECT_EQ(half_from_float(65519.996f), 0x7bff);
  EXPECT_EQ(half_from_float(65520.0f), 0x7c00);
  EXPECT_EQ(half_from_float(0x1p-24f), 0x0001);           // smallest subnormal
  EXPECT_EQ(half_from_float(0x1p-25f), 0x0000);           // tie to even
  EXPECT_EQ(half_from_float(0x1.8p-24f), 0x0002);         // tie to even (1.5 units -> 2)
  EXPECT_EQ(half_from_float(0x1p-14f), 0x0400);           // smallest normal
  EXPECT_EQ(half_from_float(1.0f + 0x1p-11f), 0x3c00);    // tie to even
  EXPECT_EQ(half_from_float(1.0f + 0x1.8p-10f), 0x3c02);  // 1.5 ulp: tie to even
  EXPECT_EQ(half_from_float(1.0f + 0x1.8p-11f), 0x3c01);  // 0.75 ulp: up
  EXPECT_EQ(float_from_half(0x0001), 0x1p-24f);
  EXPECT_EQ(float_from_half(0x7bff), 65504.0f);
  EXPECT_EQ(float_from_half(0x8000), -0.0f);
  EXPECT_TRUE(std::signbit(float_from_half(0x8000)));
  EXPECT_TRUE(std::isinf(float_from_half(0x7c00)));
}

TEST(Half, EveryHalfRoundTripsExactly) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00) continue;  // inf/NaN never cross the wire
    const float f = float_from_half(static_cast<uint16_t>(h));
    ASSERT_EQ(half_from_float(f), h) << std::hex << h;
  }
}

#ifdef __F16C__
TEST(Half, MatchesF16C) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float hw = _cvtsh_ss(static_cast<uint16_t>(h));
    const float sw = float_from_half(static_cast<uint16_t>(h));
    if (std::isnan(hw)) {
      ASSERT_TRUE(std::isnan(sw));
      continue;
    }
    ASSERT_EQ(std::bit_cast<uint32_t>(hw), std::bit_cast<uint32_t>(sw)) << std::hex << h;
  }
  Rng rng(5);
  for (int i = 0; i < 2000000; ++i) {
    // Random bit patterns, biased toward the fp16 range (exponents 100..143) half the time.
    uint32_t b = static_cast<uint32_t>(rng.next_u64());
    if (i % 2) b = (b & 0x807fffffu) | ((100u + static_cast<uint32_t>(rng.below(44))) << 23);
    const float f = std::bit_cast<float>(b);
    if (std::isnan(f)) continue;
    ASSERT_EQ(half_from_float(f), _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT)) << std::hexfloat << f;
  }
}
#endif

// Round trips of every value codec, checked element by element against the error bound that
// follows from its format (compression/values.hpp), on edge inputs.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <limits>

#include "compression/synthetic.hpp"
#include "compression/values.hpp"
#include "test_util.hpp"
#include "core/rng.hpp"

using namespace geoloco;
using namespace geoloco::compression;
using namespace geoloco::compression::testing;

namespace {

double qmax(Codec c) {
  switch (c) {
    case Codec::kInt8: return 127;
    case Codec::kInt4: return 7;
    case Codec::kInt2: return 3;
    default: return 1;
  }
}

// Largest |x - x^| the format allows for x in a group with absmax a.
// Slack, and why: 2^-20 (|x| + a) covers float rounding of s = a/qmax, x * (qmax/a) and
// q * s (a few ulps at 2^-24 each); (qmax + 1) * 2^-149 covers a subnormal scale, whose own
// rounding error (<= 2^-150) is multiplied by |q| <= qmax.
double bound(Codec c, double x, double a, double mean_abs) {
  const double ax = std::fabs(x);
  const double slack = 0x1p-20 * (ax + a) + (qmax(c) + 1) * 0x1p-149;
  switch (c) {
    case Codec::kFp32: return 0;
    case Codec::kFp16: return std::max(0x1p-11 * ax, 0x1p-25);  // half ulp; subnormal fp16 spacing 2^-24
    case Codec::kBf16: return std::max(0x1p-8 * ax, 0x1p-134);  // half ulp; bf16 subnormal spacing 2^-133
    case Codec::kInt8: return a / 127 / 2 + slack;
    case Codec::kInt4: return a / 7 / 2 + slack;
    case Codec::kInt2: {                                            // levels 2s apart, clipped at 3s
      const double s = kInt2MeanFactor * mean_abs * (1 + 0x1p-16);  // float mean of <= 2^16 terms
      return std::max(s, ax - 3 * s * (1 - 0x1p-15)) + slack;
    }
    case Codec::kFp4: return std::max(ax / 3, a * 0x1p-7) + slack;
  }
  return 0;
}

// Checks every element of a dense round trip against its group's bound.
void expect_within_bounds(Codec c, uint32_t block, std::span<const float> x, std::span<const float> y) {
  ASSERT_EQ(x.size(), y.size());
  for (size_t b = 0; b * block < x.size(); ++b) {
    const size_t begin = b * block, end = std::min(x.size(), begin + block);
    double a = 0, sum = 0;
    for (size_t i = begin; i < end; ++i) {
      a = std::max(a, std::fabs(static_cast<double>(x[i])));
      sum += std::fabs(static_cast<double>(x[i]));
    }
    const double mean = sum / static_cast<double>(end - begin);
    for (size_t i = begin; i < end; ++i) {
      ASSERT_TRUE(std::isfinite(y[i])) << codec_name(c) << " element " << i;
      ASSERT_LE(std::fabs(static_cast<double>(x[i]) - y[i]), bound(c, x[i], a, mean))
          << codec_name(c) << " element " << i << " x=" << x[i] << " y=" << y[i] << " absmax=" << a;
    }
  }
}

class EveryCodec : public ::testing::TestWithParam<Codec> {};

}  // namespace

TEST_P(EveryCodec, HeavyTailedDataWithinFormatBound) {
  const Codec c = GetParam();
  const auto x = synthetic_pseudo_gradient(10007, 7);  // not a multiple of any block
  for (uint32_t block : {16u, 128u, 1024u}) {
    const auto y = round_trip(make_config(c, block), x);
    expect_within_bounds(c, block, x, y);
  }
}

TEST_P(EveryCodec, ZerosStayZeroExactly) {
  const Codec c = GetParam();
  const std::vector<float> x(300, 0.0f);
  const auto y = round_trip(make_config(c, 64), x);
  for (float v : y) ASSERT_EQ(std::bit_cast<uint32_t>(v), 0u) << codec_name(c);  // +0, not -0 or junk
}

TEST_P(EveryCodec, EmptyShard) {
  const Codec c = GetParam();
  std::vector<uint8_t> frame;
  const auto y = round_trip(make_config(c), std::span<const float>(), &frame);
  EXPECT_TRUE(y.empty());
  EXPECT_EQ(frame.size(), kHeaderBytes + kTrailerBytes);
}

TEST_P(EveryCodec, DenormalsAndTinyBlocks) {
  const Codec c = GetParam();
  // Block 0: subnormals only (the scale itself is subnormal or underflows to 0);
  // block 1: FLT_MIN-sized normals; block 2: a mix of subnormals and ordinary values.
  std::vector<float> x(48);
  Rng rng(3);
  for (size_t i = 0; i < 16; ++i) x[i] = static_cast<float>((rng.uniform() - 0.5) * 0x1p-130);
  for (size_t i = 16; i < 32; ++i) x[i] = static_cast<float>((rng.uniform() - 0.5) * 0x1p-124);
  for (size_t i = 32; i < 48; ++i) x[i] = i % 2 ? 0x1p-140f : static_cast<float>(rng.uniform() - 0.5);
  const auto y = round_trip(make_config(c, 16), x);
  expect_within_bounds(c, 16, x, y);
}

TEST_P(EveryCodec, OneHugeOutlierPerBlock) {
  const Codec c = GetParam();
  auto x = synthetic_pseudo_gradient(4096 + 40, 11);
  for (size_t i = 5; i < x.size(); i += 128) x[i] = (i % 256 == 5 ? 1.0f : -1.0f) * 6.0e4f;  // fits fp16
  const auto y = round_trip(make_config(c, 128), x);
  expect_within_bounds(c, 128, x, y);
  // The outlier is the absmax, i.e. the top level: it comes back to within the rounding of
  // s = a/qmax and q*s (two roundings of 2^-24 each).
  if (codec_has_scales(c) && c != Codec::kInt2) {  // int2 clips outliers to 3s
    for (size_t i = 5; i < x.size(); i += 128) {
      EXPECT_LE(std::fabs(y[i] - x[i]), std::fabs(x[i]) * 0x1p-23) << codec_name(c) << " at " << i;
    }
  }
}

TEST_P(EveryCodec, LargestAllowedMagnitude) {
  const Codec c = GetParam();
  std::vector<float> x(40, 0x1p60f);
  x[3] = -0x1p64f;
  x[39] = 0x1p64f;
  if (c == Codec::kFp16) {  // fp16 tops out at 65504: refused, never sent as infinity
    Pipeline p(make_config(c, 16));
    std::vector<uint8_t> frame;
    EXPECT_THROW(p.encode(x, nullptr, frame), EncodeError);
    return;
  }
  const auto y = round_trip(make_config(c, 16), x);
  expect_within_bounds(c, 16, x, y);
}

TEST_P(EveryCodec, NonFiniteIsRejectedAtEncodeNamingTheIndex) {
  const Codec c = GetParam();
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity(), 0x1p65f}) {
    std::vector<float> x(200, 1.0f);
    x[137] = bad;
    Pipeline p(make_config(c));
    std::vector<uint8_t> frame;
    try {
      p.encode(x, nullptr, frame);
      FAIL() << "no EncodeError for " << bad;
    } catch (const EncodeError& e) {
      EXPECT_EQ(e.index(), 137u);
      EXPECT_NE(std::string(e.what()).find("index 137"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("diverged"), std::string::npos) << e.what();
    }
  }
}

TEST_P(EveryCodec, EncodingIsDeterministic) {
  const Codec c = GetParam();
  const auto x = synthetic_pseudo_gradient(5000, 99);
  std::vector<uint8_t> f1, f2;
  round_trip(make_config(c, 64, 0.25, false, 3), x, &f1);
  round_trip(make_config(c, 64, 0.25, false, 3), x, &f2);
  EXPECT_EQ(f1, f2);
}

INSTANTIATE_TEST_SUITE_P(Codecs, EveryCodec, ::testing::ValuesIn(kAllCodecs),
                         [](const auto& info) { return std::string(codec_name(info.param)); });

// Inputs that sit exactly on a codec's levels come back bit for bit.
TEST(ValueCodecs, ValuesOnTheGridAreExact) {
  std::vector<float> x;
  for (int q = -127; q <= 127; ++q) x.push_back(static_cast<float>(q) * 0.25f);  // a = 31.75, s = 0.25
  x.resize(256, 0.0f);
  EXPECT_EQ(round_trip(make_config(Codec::kInt8, 256), x), x);

  std::vector<float> x4;
  for (int q = -7; q <= 7; ++q) x4.push_back(static_cast<float>(q) * 3.0f);  // s = 3
  x4.push_back(21.0f);
  EXPECT_EQ(round_trip(make_config(Codec::kInt4, 16), x4), x4);

  // int2: s = 0.75 * mean|x| = 1 needs mean|x| = 4/3: four 3s and twenty 1s in a block of 24.
  std::vector<float> x2 = {-3, 3, -3, 3, 1, -1, 1, 1, -1, -1, 1, 1, -1, 1, -1, 1, 1, 1, -1, -1, 1, -1, 1, -1};
  EXPECT_EQ(round_trip(make_config(Codec::kInt2, 24), x2), x2);

  std::vector<float> xf = {0.0f, 1.0f, -1.0f};
  for (int e = -6; e <= -1; ++e) {
    xf.push_back(std::ldexp(5.0f, e));
    xf.push_back(-std::ldexp(5.0f, e));
  }
  xf.push_back(5.0f);
  for (float& v : xf)
    if (v == 1.0f || v == -1.0f) v *= 5.0f;  // scale s = 5: levels 5 * 2^-6 .. 5
  xf.resize(16, 0.0f);
  EXPECT_EQ(round_trip(make_config(Codec::kFp4, 16), xf), xf);
}

// Known roundings: ties go to even, and each codec lands where its rule says.
TEST(ValueCodecs, RoundingRules) {
  // int8 with a = 127 (s = 1): 2.5 -> 2, 3.5 -> 4, -2.5 -> -2 (ties to even).
  std::vector<float> x(16, 0.0f);
  x[0] = 127.0f;
  x[1] = 2.5f;
  x[2] = 3.5f;
  x[3] = -2.5f;
  x[4] = 0.49f;
  const auto y = round_trip(make_config(Codec::kInt8, 16), x);
  EXPECT_EQ(y[1], 2.0f);
  EXPECT_EQ(y[2], 4.0f);
  EXPECT_EQ(y[3], -2.0f);
  EXPECT_EQ(y[4], 0.0f);
  // fp4 with a = 1: 0.7 -> 0.5 (< 0.75), 0.8 -> 1, 0.006 -> 0 (< 2^-7), 0.009 -> 2^-6.
  std::vector<float> f(16, 0.0f);
  f[0] = 1.0f;
  f[1] = 0.7f;
  f[2] = 0.8f;
  f[3] = 0.006f;
  f[4] = -0.009f;
  const auto g = round_trip(make_config(Codec::kFp4, 16), f);
  EXPECT_EQ(g[1], 0.5f);
  EXPECT_EQ(g[2], 1.0f);
  EXPECT_EQ(g[3], 0.0f);
  EXPECT_EQ(g[4], -0x1p-6f);
  // int2 with s = 0.75 * mean|x| = 1 (|x| sums to 32 over 24): 0 -> +1 (the tie between -1
  // and 1 goes to the even code 2), 1.9 -> 1, -2.1 -> -3, 7 clips to 3.
  std::vector<float> t(24, 1.0f);
  t[0] = 0.0f;
  t[1] = 1.9f;
  t[2] = -2.1f;
  t[3] = 7.0f;
  t[4] = 2.0f;
  const auto u = round_trip(make_config(Codec::kInt2, 24), t);
  EXPECT_EQ(u[0], 1.0f);
  EXPECT_EQ(u[1], 1.0f);
  EXPECT_EQ(u[2], -3.0f);
  EXPECT_EQ(u[3], 3.0f);
  EXPECT_EQ(u[5], 1.0f);
}

TEST(ValueCodecs, Fp16OverflowIsRejectedWithIndex) {
  std::vector<float> x(100, 1.0f);
  x[42] = 65520.0f;  // rounds to fp16 infinity
  x[60] = 70000.0f;
  Pipeline p(make_config(Codec::kFp16));
  std::vector<uint8_t> frame;
  try {
    p.encode(x, nullptr, frame);
    FAIL() << "no EncodeError";
  } catch (const EncodeError& e) {
    EXPECT_EQ(e.index(), 42u);
    EXPECT_NE(std::string(e.what()).find("fp16 range"), std::string::npos);
  }
  x[42] = 65519.0f;  // rounds down to 65504
  x[60] = 1.0f;
  const auto y = round_trip(make_config(Codec::kFp16), x);
  EXPECT_EQ(y[42], 65504.0f);
}

TEST(ValueCodecs, WireSizesFollowTheLayout) {
  const auto x = synthetic_pseudo_gradient(1000, 1);
  const size_t overhead = kHeaderBytes + kTrailerBytes;
  std::vector<uint8_t> f;
  round_trip(make_config(Codec::kFp32, 128), x, &f);
  EXPECT_EQ(f.size(), overhead + 4000);
  round_trip(make_config(Codec::kBf16, 128), x, &f);
  EXPECT_EQ(f.size(), overhead + 2000);
  round_trip(make_config(Codec::kInt8, 128), x, &f);
  EXPECT_EQ(f.size(), overhead + 8 * 4 + 1000);  // 8 blocks of scales
  round_trip(make_config(Codec::kInt4, 128), x, &f);
  EXPECT_EQ(f.size(), overhead + 8 * 4 + 500);
  round_trip(make_config(Codec::kInt2, 128), x, &f);
  EXPECT_EQ(f.size(), overhead + 8 * 4 + 250);
  std::vector<float> odd(33, 1.0f);
  round_trip(make_config(Codec::kInt4, 16), odd, &f);
  EXPECT_EQ(f.size(), overhead + 3 * 4 + 17);  // 33 nibbles -> 17 bytes, padding nibble zero
  EXPECT_EQ(f[f.size() - kTrailerBytes - 1] >> 4, 0);
}

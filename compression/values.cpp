#include "compression/values.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#ifdef __F16C__
#include <immintrin.h>
#endif

#include "compression/bytes.hpp"
#include "compression/encode_error.hpp"
#include "compression/frame.hpp"
#include "compression/half.hpp"

namespace geoloco::compression {
namespace {

// Round to nearest even for |y| < 2^22 with two adds (vectorizes, unlike lrint).
inline float round_even(float y) {
  constexpr float kMagic = 0x1.8p23f;
  return (y + kMagic) - kMagic;
}

// Largest |x| of a group. Comparing the bit patterns with the sign cleared orders
// non-negative finite floats exactly and vectorizes as an integer max reduction.
float group_absmax(const float* x, size_t n) {
  uint32_t m = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t b = std::bit_cast<uint32_t>(x[i]) & 0x7fffffffu;
    m = b > m ? b : m;
  }
  return std::bit_cast<float>(m);
}

// Unaligned, alias-safe views of 16/32-bit lanes inside byte streams (codes and scales start
// at arbitrary offsets), so hot loops can use plain indexing and still vectorize.
typedef uint16_t u16_unaligned __attribute__((aligned(1), may_alias));
typedef uint32_t u32_unaligned __attribute__((aligned(1), may_alias));

// Per-element code (one byte per element) for the scaled codecs, given y = x / s computed as
// x * inv (or x / s when 1/s overflows, i.e. s is tiny and subnormal). Written with 32-bit
// integer selects only, so every variant vectorizes.
template <Codec C, bool kDivide>
void quantize_group(const float* __restrict x, size_t n, float inv, float s, uint8_t* __restrict q) {
  for (size_t i = 0; i < n; ++i) {
    if constexpr (C == Codec::kFp4) {
      const float y = kDivide ? std::fabs(x[i]) / s : std::fabs(x[i]) * inv;
      // Scaling by 4/3 moves the round-to-nearest threshold between 2^k and 2^(k+1)
      // (at 1.5 * 2^k) onto a power of two, so the exponent field of t is the level:
      // level 2^(m-7) has biased exponent m + 120.
      const float t = y * (4.0f / 3.0f);
      const int32_t tb = static_cast<int32_t>(std::bit_cast<uint32_t>(t));
      int32_t m = (tb >> 23) - 120;
      m = m > 7 ? 7 : m;
      const int32_t low = y >= 0x1p-7f ? 1 : 0;  // between 0 and 2^-6 the midpoint is 2^-7
      m = m >= 1 ? m : low;
      const int32_t neg = static_cast<int32_t>(std::bit_cast<uint32_t>(x[i]) >> 31);
      const int32_t sign = (neg != 0 && m != 0) ? 8 : 0;  // never a negative zero
      q[i] = static_cast<uint8_t>(m | sign);
    } else {
      const float y = kDivide ? x[i] / s : x[i] * inv;
      if constexpr (C == Codec::kInt8) {
        int32_t v = static_cast<int32_t>(round_even(y));
        v = v > 127 ? 127 : (v < -127 ? -127 : v);
        q[i] = static_cast<uint8_t>(v);
      } else if constexpr (C == Codec::kInt4) {
        int32_t v = static_cast<int32_t>(round_even(y));
        v = v > 7 ? 7 : (v < -7 ? -7 : v);
        q[i] = static_cast<uint8_t>(v + 8);
      } else {  // kInt2: levels -3,-1,1,3 -> codes 0..3; |y| > 3 clips to the outer level
        const float t = std::min(std::max(y * 0.5f + 1.5f, 0.0f), 3.0f);
        q[i] = static_cast<uint8_t>(static_cast<int32_t>(round_even(t)));
      }
    }
  }
}

// Mean |x| with 8 fixed partial sums, so the result does not depend on the vector width
// the compiler picked (same input, same scale, on every machine).
float mean_abs(const float* x, size_t n) {
  float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) part[l] += std::fabs(x[i + l]);
  for (; i < n; ++i) part[i % 8] += std::fabs(x[i]);
  const float s = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
  return s / static_cast<float>(n);
}

constexpr float qmax_of(Codec c) {
  switch (c) {
    case Codec::kInt8: return 127.0f;
    case Codec::kInt4: return 7.0f;
    case Codec::kInt2: return 3.0f;
    default: return 1.0f;  // fp4: the scale is the absmax itself
  }
}

// Scale of a group: absmax / qmax, except int2, whose 4 levels are too coarse for absmax
// scaling of heavy-tailed data (most values would land on +-a/3): there s = 0.75 * mean|x|
// and values beyond 3s clip to +-3s (error feedback carries the clipped part).
template <Codec C>
float group_scale(const float* x, size_t n, float& inv) {
  if constexpr (C == Codec::kInt2) {
    const float s = kInt2MeanFactor * mean_abs(x, n);
    inv = 1.0f / s;
    return s;
  } else {
    constexpr float kQmax = qmax_of(C);
    const float a = group_absmax(x, n);
    inv = kQmax / a;
    return a / kQmax;
  }
}

template <Codec C>
void encode_scaled(std::span<const float> x, size_t group, uint8_t* scales, uint8_t* q) {
  const size_t groups = (x.size() + group - 1) / group;
  for (size_t g = 0; g < groups; ++g) {
    const size_t begin = g * group;
    const size_t len = std::min(group, x.size() - begin);
    float inv = 0.0f;
    const float s = group_scale<C>(x.data() + begin, len, inv);
    bytes::store<float>(scales + g * sizeof(float), s);
    uint8_t* qg = q + begin;
    if (s == 0.0f) {
      // All zero, or so tiny that the scale underflows: every code reconstructs to 0.
      quantize_group<C, false>(x.data() + begin, len, 0.0f, 1.0f, qg);
    } else if (std::isfinite(inv)) {
      quantize_group<C, false>(x.data() + begin, len, inv, s, qg);
    } else {
      quantize_group<C, true>(x.data() + begin, len, inv, s, qg);
    }
  }
}

// Packs one-byte codes of `bits` (2 or 4) into a stream, low bits first.
void pack(const uint8_t* q, size_t n, int bits, uint8_t* out) {
  if (bits == 4) {
    const size_t pairs = n / 2;
    for (size_t j = 0; j < pairs; ++j) out[j] = static_cast<uint8_t>(q[2 * j] | (q[2 * j + 1] << 4));
    if (n % 2) out[pairs] = q[n - 1];
  } else {
    const size_t quads = n / 4;
    for (size_t j = 0; j < quads; ++j)
      out[j] = static_cast<uint8_t>(q[4 * j] | (q[4 * j + 1] << 2) | (q[4 * j + 2] << 4) | (q[4 * j + 3] << 6));
    if (n % 4) {
      uint8_t b = 0;
      for (size_t i = quads * 4; i < n; ++i) b = static_cast<uint8_t>(b | (q[i] << (2 * (i - quads * 4))));
      out[quads] = b;
    }
  }
}

void unpack(const uint8_t* in, size_t n, int bits, uint8_t* q) {
  if (bits == 4) {
    const size_t pairs = n / 2;
    for (size_t j = 0; j < pairs; ++j) {
      q[2 * j] = in[j] & 15;
      q[2 * j + 1] = in[j] >> 4;
    }
    if (n % 2) {
      if (in[pairs] >> 4)
        throw FrameError(FrameFault::kPayload, "non-zero padding bits after the last 4-bit code");
      q[n - 1] = in[pairs] & 15;
    }
  } else {
    const size_t quads = n / 4;
    for (size_t j = 0; j < quads; ++j) {
      q[4 * j] = in[j] & 3;
      q[4 * j + 1] = (in[j] >> 2) & 3;
      q[4 * j + 2] = (in[j] >> 4) & 3;
      q[4 * j + 3] = in[j] >> 6;
    }
    if (const size_t rest = n % 4) {
      const uint8_t b = in[quads];
      if (b >> (2 * rest))
        throw FrameError(FrameFault::kPayload, "non-zero padding bits after the last 2-bit code");
      for (size_t i = 0; i < rest; ++i) q[quads * 4 + i] = (b >> (2 * i)) & 3;
    }
  }
}

void dequantize_int8(const int8_t* __restrict q, size_t n, float s, float* __restrict o) {
  for (size_t i = 0; i < n; ++i) o[i] = static_cast<float>(q[i]) * s;
}

// Codes of the 4- and 2-bit codecs to level * s, computed rather than looked up so the loop
// vectorizes: int4 c - 8; int2 2c - 3; fp4 sign (bit 3) and 2^(m-7) built from its exponent
// bits (biased exponent m + 120), zero for m = 0.
template <Codec C>
void dequantize_small(const uint8_t* __restrict q, size_t n, float s, float* __restrict o) {
  for (size_t i = 0; i < n; ++i) {
    const int32_t c = q[i];
    if constexpr (C == Codec::kInt4) {
      o[i] = static_cast<float>(c - 8) * s;
    } else if constexpr (C == Codec::kInt2) {
      o[i] = static_cast<float>(2 * c - 3) * s;
    } else {
      const uint32_t m = static_cast<uint32_t>(c & 7);
      const uint32_t mag = m != 0 ? (m + 120u) << 23 : 0u;
      const uint32_t sign = static_cast<uint32_t>(c & 8) << 28;
      o[i] = std::bit_cast<float>(mag | sign) * s;
    }
  }
}

float load_scale(const uint8_t* scales, size_t g) {
  const float s = bytes::load<float>(scales + g * sizeof(float));
  // Rejects negatives (and -0), NaN, inf and anything the encoder cannot produce.
  if (std::bit_cast<uint32_t>(s) >> 31 || !(s <= kMaxAbsValue))
    throw FrameError(FrameFault::kPayload, fmt::format("scale {} of group {} is not in [0, 2^64]", s, g));
  return s;
}

[[noreturn]] void bad_code(size_t index, unsigned code, Codec c) {
  throw FrameError(FrameFault::kPayload,
                   fmt::format("code {} at element {} is not a {} code", code, index, codec_name(c)));
}

// Finds the first failing element after a vectorized loop flagged a problem.
template <class Pred>
size_t first_index(size_t n, Pred bad) {
  for (size_t i = 0; i < n; ++i)
    if (bad(i)) return i;
  return n;
}

}  // namespace

void encode_values(Codec codec, std::span<const float> x, size_t group, uint8_t* scales, uint8_t* codes,
                   std::vector<uint8_t>& scratch) {
  const size_t n = x.size();
  switch (codec) {
    case Codec::kFp32:
      if (n) std::memcpy(codes, x.data(), n * sizeof(float));
      return;
    case Codec::kFp16: {
      u16_unaligned* __restrict out = reinterpret_cast<u16_unaligned*>(codes);
      size_t i0 = 0;
#ifdef __F16C__
      // F16C converts 8 at a time with the same round-to-nearest-even result as half_from_float.
      for (; i0 + 8 <= n; i0 += 8)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + 2 * i0),
                         _mm256_cvtps_ph(_mm256_loadu_ps(x.data() + i0), _MM_FROUND_TO_NEAREST_INT));
#endif
      for (size_t i = i0; i < n; ++i) out[i] = half_from_float(x[i]);
      // Overflow shows as the fp16 infinity (0x7c00 with the sign cleared): a max reduction.
      uint16_t top = 0;
      for (size_t i = 0; i < n; ++i) {
        const uint16_t b = static_cast<uint16_t>(out[i] & 0x7fffu);
        top = b > top ? b : top;
      }
      if (top >= 0x7c00) {
        const size_t i = first_index(n, [&](size_t k) { return std::fabs(x[k]) >= 65520.0f; });
        throw EncodeError(i, fmt::format("value {} at index {} is outside the fp16 range (|x| < 65520); "
                                         "use codec bf16 or a scaled codec", x[i], i));
      }
      return;
    }
    case Codec::kBf16:
      // |x| <= 2^64 is checked by the caller, so rounding never reaches the bf16 infinity.
      {
        u16_unaligned* __restrict out = reinterpret_cast<u16_unaligned*>(codes);
        const float* __restrict in = x.data();
        for (size_t i = 0; i < n; ++i) {
          const uint32_t u = std::bit_cast<uint32_t>(in[i]);
          out[i] = static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
        }
      }
      return;
    case Codec::kInt8:
      encode_scaled<Codec::kInt8>(x, group, scales, codes);
      return;
    case Codec::kInt4:
    case Codec::kFp4:
    case Codec::kInt2: {
      scratch.resize(n);
      if (codec == Codec::kInt4)
        encode_scaled<Codec::kInt4>(x, group, scales, scratch.data());
      else if (codec == Codec::kFp4)
        encode_scaled<Codec::kFp4>(x, group, scales, scratch.data());
      else
        encode_scaled<Codec::kInt2>(x, group, scales, scratch.data());
      pack(scratch.data(), n, codec_bits(codec), codes);
      return;
    }
  }
}

void decode_values(Codec codec, const uint8_t* scales, const uint8_t* codes, size_t n, size_t group,
                   float* out, std::vector<uint8_t>& scratch) {
  // Each case decodes in one vectorizable pass and validates in another (a max or count
  // reduction), then looks for the first bad element only when there is one.
  switch (codec) {
    case Codec::kFp32: {
      if (n) std::memcpy(out, codes, n * sizeof(float));
      const u32_unaligned* bits = reinterpret_cast<const u32_unaligned*>(out);
      uint32_t top = 0;
      for (size_t i = 0; i < n; ++i) {
        const uint32_t b = bits[i] & 0x7fffffffu;
        top = b > top ? b : top;
      }
      if (top >= 0x7f800000u) {
        const size_t i = first_index(n, [&](size_t k) { return !std::isfinite(out[k]); });
        throw FrameError(FrameFault::kPayload, fmt::format("non-finite fp32 value at element {}", i));
      }
      return;
    }
    case Codec::kFp16:
    case Codec::kBf16: {
      const u16_unaligned* __restrict in = reinterpret_cast<const u16_unaligned*>(codes);
      float* __restrict o = out;
      uint16_t top = 0;
      for (size_t i = 0; i < n; ++i) {
        const uint16_t b = static_cast<uint16_t>(in[i] & 0x7fffu);
        top = b > top ? b : top;
      }
      const uint16_t inf = codec == Codec::kFp16 ? 0x7c00 : 0x7f80;
      if (top >= inf) {
        const size_t i = first_index(n, [&](size_t k) { return (in[k] & 0x7fffu) >= inf; });
        throw FrameError(FrameFault::kPayload,
                         fmt::format("non-finite {} value at element {}", codec_name(codec), i));
      }
      if (codec == Codec::kFp16) {
        size_t i0 = 0;
#ifdef __F16C__
        for (; i0 + 8 <= n; i0 += 8)
          _mm256_storeu_ps(o + i0, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + 2 * i0))));
#endif
        for (size_t i = i0; i < n; ++i) o[i] = float_from_half(static_cast<uint16_t>(in[i]));
      } else {
        for (size_t i = 0; i < n; ++i) o[i] = std::bit_cast<float>(static_cast<uint32_t>(in[i]) << 16);
      }
      return;
    }
    case Codec::kInt8: {
      size_t bad = 0;
      for (size_t i = 0; i < n; ++i) bad += codes[i] == 0x80;
      if (bad) {
        const size_t i = first_index(n, [&](size_t k) { return codes[k] == 0x80; });
        bad_code(i, codes[i], codec);
      }
      const size_t groups = (n + group - 1) / group;
      for (size_t g = 0; g < groups; ++g) {
        const float s = load_scale(scales, g);
        const size_t begin = g * group;
        dequantize_int8(reinterpret_cast<const int8_t*>(codes) + begin, std::min(group, n - begin), s, out + begin);
      }
      return;
    }
    case Codec::kInt4:
    case Codec::kFp4:
    case Codec::kInt2: {
      scratch.resize(n);
      unpack(codes, n, codec_bits(codec), scratch.data());
      const uint8_t* q = scratch.data();
      const uint8_t invalid = codec == Codec::kInt4 ? 0 : 8;  // int2 codes are 0..3: all valid
      if (codec != Codec::kInt2) {
        size_t bad = 0;
        for (size_t i = 0; i < n; ++i) bad += q[i] == invalid;
        if (bad) {
          const size_t i = first_index(n, [&](size_t k) { return q[k] == invalid; });
          bad_code(i, q[i], codec);
        }
      }
      const size_t groups = (n + group - 1) / group;
      for (size_t g = 0; g < groups; ++g) {
        const float s = load_scale(scales, g);
        const size_t begin = g * group;
        const size_t len = std::min(group, n - begin);
        if (codec == Codec::kInt4)
          dequantize_small<Codec::kInt4>(q + begin, len, s, out + begin);
        else if (codec == Codec::kFp4)
          dequantize_small<Codec::kFp4>(q + begin, len, s, out + begin);
        else
          dequantize_small<Codec::kInt2>(q + begin, len, s, out + begin);
      }
      return;
    }
  }
}

}  // namespace geoloco::compression

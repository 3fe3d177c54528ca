#include "compression/values.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "compression/bytes.hpp"
#include "compression/encode_error.hpp"
#include "compression/frame.hpp"

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

// Levels of the 4- and 2-bit codecs as multiples of the scale, indexed by code.
struct Lut {
  float level[16];
  bool valid[16];
};
Lut make_lut(Codec c) {
  Lut l{};
  for (int code = 0; code < 16; ++code) {
    l.valid[code] = false;
    l.level[code] = 0.0f;
  }
  if (c == Codec::kInt4) {
    for (int code = 1; code < 16; ++code) {
      l.level[code] = static_cast<float>(code - 8);
      l.valid[code] = true;
    }
  } else if (c == Codec::kFp4) {
    for (int code = 0; code < 16; ++code) {
      const int m = code & 7;
      const float mag = m == 0 ? 0.0f : std::ldexp(1.0f, m - 7);
      l.level[code] = (code & 8) ? -mag : mag;
      l.valid[code] = code != 8;  // the encoder never emits negative zero
    }
  } else if (c == Codec::kInt2) {
    for (int code = 0; code < 4; ++code) {
      l.level[code] = static_cast<float>(2 * code - 3);
      l.valid[code] = true;
    }
  }
  return l;
}

// Per-element code (one byte per element) for the scaled codecs, given y = x / s computed as
// x * inv (or x / s when 1/s overflows, i.e. s is tiny and subnormal).
template <Codec C, bool kDivide>
void quantize_group(const float* x, size_t n, float inv, float s, uint8_t* q) {
  for (size_t i = 0; i < n; ++i) {
    if constexpr (C == Codec::kFp4) {
      const float y = (kDivide ? std::fabs(x[i]) / s : std::fabs(x[i]) * inv);
      // Scaling by 4/3 moves the round-to-nearest threshold between 2^k and 2^(k+1)
      // (at 1.5 * 2^k) onto a power of two, so the exponent field is the level.
      const float t = y * (4.0f / 3.0f);
      const int e = static_cast<int>(std::bit_cast<uint32_t>(t) >> 23) - 127;
      int m = e + 7;
      m = m > 7 ? 7 : m;
      const int low = y >= 0x1p-7f ? 1 : 0;  // between 0 and 2^-6 the midpoint is 2^-7
      m = t >= 0x1p-6f ? m : low;
      const int sign = (x[i] < 0.0f && m != 0) ? 8 : 0;
      q[i] = static_cast<uint8_t>(m | sign);
    } else {
      const float y = kDivide ? x[i] / s : x[i] * inv;
      if constexpr (C == Codec::kInt8) {
        int v = static_cast<int>(round_even(y));
        v = v > 127 ? 127 : (v < -127 ? -127 : v);
        q[i] = static_cast<uint8_t>(static_cast<int8_t>(v));
      } else if constexpr (C == Codec::kInt4) {
        int v = static_cast<int>(round_even(y));
        v = v > 7 ? 7 : (v < -7 ? -7 : v);
        q[i] = static_cast<uint8_t>(v + 8);
      } else {  // kInt2: levels -3,-1,1,3 -> codes 0..3
        int v = static_cast<int>(round_even(y * 0.5f + 1.5f));
        v = v > 3 ? 3 : (v < 0 ? 0 : v);
        q[i] = static_cast<uint8_t>(v);
      }
    }
  }
}

constexpr float qmax_of(Codec c) {
  switch (c) {
    case Codec::kInt8: return 127.0f;
    case Codec::kInt4: return 7.0f;
    case Codec::kInt2: return 3.0f;
    default: return 1.0f;  // fp4: the scale is the absmax itself
  }
}

template <Codec C>
void encode_scaled(std::span<const float> x, size_t group, uint8_t* scales, uint8_t* q) {
  constexpr float kQmax = qmax_of(C);
  const size_t groups = (x.size() + group - 1) / group;
  for (size_t g = 0; g < groups; ++g) {
    const size_t begin = g * group;
    const size_t len = std::min(group, x.size() - begin);
    const float a = group_absmax(x.data() + begin, len);
    const float s = a / kQmax;
    bytes::store<float>(scales + g * sizeof(float), s);
    uint8_t* qg = q + begin;
    if (s == 0.0f) {
      // All zero, or so tiny that a/qmax underflows: every code reconstructs to 0.
      quantize_group<C, false>(x.data() + begin, len, 0.0f, 1.0f, qg);
      continue;
    }
    const float inv = kQmax / a;
    if (std::isfinite(inv))
      quantize_group<C, false>(x.data() + begin, len, inv, s, qg);
    else
      quantize_group<C, true>(x.data() + begin, len, inv, s, qg);
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
      bool overflow = false;
      for (size_t i = 0; i < n; ++i) {
        const _Float16 h = static_cast<_Float16>(x[i]);
        const uint16_t b = std::bit_cast<uint16_t>(h);
        overflow |= (b & 0x7c00) == 0x7c00;
        bytes::store<uint16_t>(codes + 2 * i, b);
      }
      if (overflow) {
        const size_t i = first_index(n, [&](size_t k) { return std::fabs(x[k]) >= 65520.0f; });
        throw EncodeError(i, fmt::format("value {} at index {} is outside the fp16 range (|x| < 65520); "
                                         "use codec bf16 or a scaled codec", x[i], i));
      }
      return;
    }
    case Codec::kBf16:
      // |x| <= 2^64 is checked by the caller, so rounding never reaches the bf16 infinity.
      for (size_t i = 0; i < n; ++i) {
        const uint32_t u = std::bit_cast<uint32_t>(x[i]);
        const uint32_t r = u + 0x7fffu + ((u >> 16) & 1u);
        bytes::store<uint16_t>(codes + 2 * i, static_cast<uint16_t>(r >> 16));
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
  switch (codec) {
    case Codec::kFp32: {
      bool bad = false;
      for (size_t i = 0; i < n; ++i) {
        const uint32_t u = bytes::load<uint32_t>(codes + 4 * i);
        bad |= (u & 0x7f800000u) == 0x7f800000u;
        out[i] = std::bit_cast<float>(u);
      }
      if (bad) {
        const size_t i = first_index(n, [&](size_t k) { return !std::isfinite(out[k]); });
        throw FrameError(FrameFault::kPayload, fmt::format("non-finite fp32 value at element {}", i));
      }
      return;
    }
    case Codec::kFp16: {
      bool bad = false;
      for (size_t i = 0; i < n; ++i) {
        const uint16_t b = bytes::load<uint16_t>(codes + 2 * i);
        bad |= (b & 0x7c00) == 0x7c00;
        out[i] = static_cast<float>(std::bit_cast<_Float16>(b));
      }
      if (bad) {
        const size_t i = first_index(n, [&](size_t k) { return !std::isfinite(out[k]); });
        throw FrameError(FrameFault::kPayload, fmt::format("non-finite fp16 value at element {}", i));
      }
      return;
    }
    case Codec::kBf16: {
      bool bad = false;
      for (size_t i = 0; i < n; ++i) {
        const uint16_t b = bytes::load<uint16_t>(codes + 2 * i);
        bad |= (b & 0x7f80) == 0x7f80;
        out[i] = std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
      }
      if (bad) {
        const size_t i = first_index(n, [&](size_t k) { return !std::isfinite(out[k]); });
        throw FrameError(FrameFault::kPayload, fmt::format("non-finite bf16 value at element {}", i));
      }
      return;
    }
    case Codec::kInt8: {
      const size_t groups = (n + group - 1) / group;
      bool bad = false;
      for (size_t g = 0; g < groups; ++g) {
        const float s = load_scale(scales, g);
        const size_t begin = g * group;
        const size_t len = std::min(group, n - begin);
        const int8_t* q = reinterpret_cast<const int8_t*>(codes) + begin;
        float* o = out + begin;
        for (size_t i = 0; i < len; ++i) {
          bad |= q[i] == -128;
          o[i] = static_cast<float>(q[i]) * s;
        }
      }
      if (bad) {
        const size_t i = first_index(n, [&](size_t k) { return codes[k] == 0x80; });
        bad_code(i, codes[i], codec);
      }
      return;
    }
    case Codec::kInt4:
    case Codec::kFp4:
    case Codec::kInt2: {
      static const Lut kLuts[3] = {make_lut(Codec::kInt4), make_lut(Codec::kFp4), make_lut(Codec::kInt2)};
      const Lut& lut = kLuts[codec == Codec::kInt4 ? 0 : (codec == Codec::kFp4 ? 1 : 2)];
      scratch.resize(n);
      unpack(codes, n, codec_bits(codec), scratch.data());
      const uint8_t* q = scratch.data();
      const uint8_t invalid = codec == Codec::kInt4 ? 0 : (codec == Codec::kFp4 ? 8 : 0xff);
      bool bad = false;
      const size_t groups = (n + group - 1) / group;
      for (size_t g = 0; g < groups; ++g) {
        const float s = load_scale(scales, g);
        const size_t begin = g * group;
        const size_t len = std::min(group, n - begin);
        float* o = out + begin;
        const uint8_t* qg = q + begin;
        for (size_t i = 0; i < len; ++i) {
          bad |= qg[i] == invalid;
          o[i] = lut.level[qg[i]] * s;
        }
      }
      if (bad) {
        const size_t i = first_index(n, [&](size_t k) { return !lut.valid[q[k]]; });
        bad_code(i, q[i], codec);
      }
      return;
    }
  }
}

}  // namespace geoloco::compression

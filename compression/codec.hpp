// Value codecs of the compression pipeline: their wire ids, names and bit widths.
// The numeric ids are part of the frame format (compression/README.md): never renumber.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace geoloco::compression {

enum class Codec : uint8_t {
  kFp32 = 0,  // no value compression (exact)
  kFp16 = 1,  // IEEE half, round to nearest even
  kBf16 = 2,  // bfloat16, round to nearest even
  kInt8 = 3,  // symmetric int8, blockwise absmax scale: x ~ q * absmax/127, q in [-127, 127]
  kInt4 = 4,  // symmetric 4-bit integer, blockwise absmax scale: q in [-7, 7]
  kFp4 = 5,   // 4-bit sign + 3-bit exponent (E3M0), blockwise absmax scale: |x| ~ s * 2^(e-7)
  kInt2 = 6,  // 2-bit uniform levels {-3,-1,1,3} * absmax/3
};
inline constexpr int kCodecCount = 7;

std::string_view codec_name(Codec c);
std::optional<Codec> codec_from_name(std::string_view name);
// Wire id -> codec, nullopt for unknown ids (the frame decoder rejects those).
std::optional<Codec> codec_from_id(uint8_t id);
// Bits per transmitted value code (32, 16, 16, 8, 4, 4, 2).
int codec_bits(Codec c);
// Whether the codec carries one fp32 scale per block (the integer and fp4 codecs).
bool codec_has_scales(Codec c);
// Whether the codec loses information (everything but fp32).
inline bool codec_is_lossy(Codec c) { return c != Codec::kFp32; }

}  // namespace geoloco::compression

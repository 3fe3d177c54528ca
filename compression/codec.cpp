#include "compression/codec.hpp"

#include <array>

namespace geoloco::compression {
namespace {
constexpr std::array<std::string_view, kCodecCount> kNames = {"fp32", "fp16", "bf16", "int8",
                                                              "int4", "fp4",  "int2"};
constexpr std::array<int, kCodecCount> kBits = {32, 16, 16, 8, 4, 4, 2};
}  // namespace

std::string_view codec_name(Codec c) { return kNames.at(static_cast<size_t>(c)); }

std::optional<Codec> codec_from_name(std::string_view name) {
  for (size_t i = 0; i < kNames.size(); ++i)
    if (kNames[i] == name) return static_cast<Codec>(i);
  return std::nullopt;
}

std::optional<Codec> codec_from_id(uint8_t id) {
  if (id >= kCodecCount) return std::nullopt;
  return static_cast<Codec>(id);
}

int codec_bits(Codec c) { return kBits.at(static_cast<size_t>(c)); }

bool codec_has_scales(Codec c) {
  return c == Codec::kInt8 || c == Codec::kInt4 || c == Codec::kFp4 || c == Codec::kInt2;
}

}  // namespace geoloco::compression

// Helpers shared by the compression tests.
#pragma once

#include <functional>
#include <span>
#include <string>
#include <vector>

#include "compression/pipeline.hpp"

namespace geoloco::compression::testing {

inline PipelineConfig make_config(Codec codec, uint32_t block = 128, std::optional<double> topk = std::nullopt,
                                  bool ef = false, int zstd = 0) {
  PipelineConfig c;
  c.codec = codec;
  c.block = block;
  c.topk = topk;
  c.error_feedback = ef;
  c.zstd_level = zstd;
  return c;
}

// Encode then decode through a fresh pipeline.
inline std::vector<float> round_trip(const PipelineConfig& cfg, std::span<const float> x,
                                     std::vector<uint8_t>* frame_out = nullptr) {
  Pipeline p(cfg);
  std::vector<uint8_t> frame;
  p.encode(x, nullptr, frame);
  std::vector<float> y(x.size(), -1.0f);
  p.decode(frame, x.size(), y);
  if (frame_out) *frame_out = frame;
  return y;
}

// The FrameFault a call throws, or nullopt if it throws nothing (other exceptions escape).
inline std::optional<FrameFault> fault_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const FrameError& e) {
    return e.fault();
  }
  return std::nullopt;
}

inline constexpr Codec kAllCodecs[] = {Codec::kFp32, Codec::kFp16, Codec::kBf16, Codec::kInt8,
                                       Codec::kInt4, Codec::kFp4,  Codec::kInt2};

}  // namespace geoloco::compression::testing

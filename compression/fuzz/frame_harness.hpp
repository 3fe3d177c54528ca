// What the frame fuzzer does with one input, shared by the libFuzzer target and the corpus
// regression test so both replay inputs identically.
//
// Each input is decoded twice: as given (mostly stopped by the checksum), and "resealed" with
// a correct checksum so mutations reach the zstd stage and the payload checks. The decoder
// may only answer with a valid decode or FrameError; anything else escapes (the fuzzer then
// reports it). A successful decode must produce finite values only.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <span>
#include <vector>

#include "compression/bytes.hpp"
#include "compression/pipeline.hpp"

namespace geoloco::compression::fuzz {

struct Outcome {
  std::optional<FrameFault> as_given;  // nullopt: decoded fine
  std::optional<FrameFault> resealed;  // nullopt: decoded fine, or input too short to reseal
};

// Elements the harness expects: what the header claims, capped so the fuzzer cannot make us
// allocate much (larger claims then exercise the element-count check).
inline uint64_t harness_expected_elements(std::span<const uint8_t> data) {
  constexpr uint64_t kCap = uint64_t{1} << 16;
  if (data.size() < 24) return 64;
  const uint64_t claimed = bytes::load<uint64_t>(data.data() + 16);
  return claimed <= kCap ? claimed : kCap;
}

inline std::optional<FrameFault> decode_one(Pipeline& p, std::span<const uint8_t> frame, uint64_t expected,
                                            std::vector<float>& out) {
  out.resize(expected);  // contents are overwritten by a successful decode
  try {
    p.decode(frame, expected, out);
  } catch (const FrameError& e) {
    return e.fault();
  }
  for (float v : out)
    if (!std::isfinite(v)) std::abort();  // the decoder promised finite output
  return std::nullopt;
}

inline Outcome run_frame_input(std::span<const uint8_t> data) {
  Pipeline p(PipelineConfig{});
  std::vector<float> out;
  const uint64_t expected = harness_expected_elements(data);
  Outcome o;
  o.as_given = decode_one(p, data, expected, out);
  // A claim one element off must always be refused.
  if (decode_one(p, data, expected + 1, out) == std::nullopt) std::abort();
  if (data.size() >= kHeaderBytes + kTrailerBytes) {
    std::vector<uint8_t> copy(data.begin(), data.end());
    const size_t body = copy.size() - kTrailerBytes;
    bytes::store<uint64_t>(copy.data() + body, frame_checksum({copy.data(), body}));
    o.resealed = decode_one(p, copy, expected, out);
  }
  return o;
}

}  // namespace geoloco::compression::fuzz

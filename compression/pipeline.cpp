#include "compression/pipeline.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstring>

#include "compression/bytes.hpp"
#include "compression/topk.hpp"
#include "compression/values.hpp"

namespace geoloco::compression {
namespace {

FrameInfo info_of(const FrameHeader& h) {
  return FrameInfo{h.codec, h.topk(), h.zstd(), h.elements, h.raw_bytes, h.frame_bytes()};
}

// Finite and within kMaxAbsValue, as one vectorizable max reduction over the bit patterns
// (with the sign cleared, finite floats order like their bits and NaN/inf sort above all).
bool all_in_range(const float* x, size_t n) {
  uint32_t top = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t b = std::bit_cast<uint32_t>(x[i]) & 0x7fffffffu;
    top = b > top ? b : top;
  }
  return top <= std::bit_cast<uint32_t>(kMaxAbsValue);
}

}  // namespace

Pipeline::Pipeline(const PipelineConfig& config) : config_(config) {
  config_.validate();
  if (config_.zstd_level > 0) zc_ = std::make_unique<ZstdCompressor>(config_.zstd_level);
}

FrameInfo Pipeline::encode(std::span<const float> values, ErrorFeedback* ef, std::vector<uint8_t>& frame_out) {
  GEOLOCO_CHECK((ef != nullptr) == config_.error_feedback,
                "error feedback is {} in the config but encode got {} residual", config_.error_feedback ? "on" : "off",
                ef ? "a" : "no");
  if (ef)
    GEOLOCO_CHECK(ef->size() == values.size(), "error-feedback residual has {} elements, the shard {}", ef->size(),
                  values.size());
  return encode_impl(values, ef ? ef->residual() : std::span<float>(), ef != nullptr, frame_out);
}

FrameInfo Pipeline::encode_with_residual(std::span<const float> values, std::span<float> residual,
                                         std::vector<uint8_t>& frame_out) {
  GEOLOCO_CHECK(config_.error_feedback, "encode_with_residual: error feedback is off in the config");
  GEOLOCO_CHECK(residual.size() == values.size(), "error-feedback residual has {} elements, the part {}",
                residual.size(), values.size());
  return encode_impl(values, residual, true, frame_out);
}

FrameInfo Pipeline::encode_impl(std::span<const float> values, std::span<float> residual, bool with_ef,
                                std::vector<uint8_t>& frame_out) {
  float* const ef = with_ef ? residual.data() : nullptr;
  const uint64_t n = values.size();
  if (n > kMaxElements) throw Error(fmt::format("compression: shard of {} elements exceeds 2^40", n));
  std::span<const float> input = values;
  if (with_ef) {
    corrected_.resize(n);
    const float* r = ef;
    if (config_.error_feedback_decay < 1.0) {
      const float beta = static_cast<float>(config_.error_feedback_decay);
      for (size_t i = 0; i < n; ++i) corrected_[i] = values[i] + beta * r[i];
    } else {
      for (size_t i = 0; i < n; ++i) corrected_[i] = values[i] + r[i];
    }
    input = corrected_;
  }
  if (!all_in_range(input.data(), n)) {
    for (size_t i = 0; i < n; ++i) {
      if (std::fabs(input[i]) <= kMaxAbsValue) continue;
      const char* what = std::isfinite(input[i]) ? "exceeds 2^64" : "is not finite";
      if (with_ef)
        throw EncodeError(i, fmt::format("pseudo-gradient value {} at index {} plus error-feedback residual {} "
                                         "{}: the site diverged",
                                         values[i], i, ef[i], what));
      throw EncodeError(i,
                        fmt::format("pseudo-gradient value {} at index {} {}: the site diverged", values[i], i, what));
    }
  }

  FrameHeader h;
  h.codec = config_.codec;
  h.block = config_.block;
  h.topk_k = config_.topk ? config_.topk_per_block() : 0;
  h.flags = config_.topk ? kFlagTopk : 0;
  h.elements = n;
  const PayloadLayout layout = payload_layout(h.codec, h.block, h.topk_k, n);
  h.raw_bytes = layout.total;

  // Without zstd the payload is built in place in the frame; with it, in raw_ first.
  uint8_t* raw;
  if (zc_) {
    raw_.resize(layout.total);
    raw = raw_.data();
  } else {
    frame_out.resize(kHeaderBytes + layout.total + kTrailerBytes);
    raw = frame_out.data() + kHeaderBytes;
  }
  std::span<const float> dense = input;
  size_t group = config_.block;
  if (h.topk()) {
    kept_.resize(layout.kept);
    topk_select(input, layout, h.block, raw + layout.index_offset, kept_.data(), topk_scratch_);
    dense = kept_;
    group = layout.kept_full;
  }
  encode_values(h.codec, dense, group, raw + layout.scales_offset, raw + layout.codes_offset, codes_);

  if (with_ef) {
    // The residual is measured against exactly what receivers decode from these bytes
    // (decoded now, while `raw` is certainly valid; committed once the frame is complete).
    decoded_.resize(n);
    decode_payload(h, raw, decoded_);
  }

  size_t stored = layout.total;
  if (zc_ && layout.total > 0) {
    frame_out.resize(kHeaderBytes + layout.total + kTrailerBytes);
    const size_t z = zc_->compress({raw, layout.total}, {frame_out.data() + kHeaderBytes, layout.total - 1});
    if (z > 0) {
      stored = z;
      h.flags |= kFlagZstd;
    } else {
      std::memcpy(frame_out.data() + kHeaderBytes, raw, layout.total);
    }
  } else if (zc_) {
    frame_out.resize(kHeaderBytes + kTrailerBytes);
  }
  h.stored_bytes = stored;
  frame_out.resize(h.frame_bytes());
  write_header(h, frame_out.data());
  const size_t body = kHeaderBytes + stored;
  bytes::store<uint64_t>(frame_out.data() + body, frame_checksum({frame_out.data(), body}));

  if (with_ef) {
    for (size_t i = 0; i < n; ++i) ef[i] = corrected_[i] - decoded_[i];
  }
  const FrameInfo info = info_of(h);
  totals_.add(info);
  return info;
}

void Pipeline::decode_payload(const FrameHeader& h, const uint8_t* payload, std::span<float> out) {
  const PayloadLayout layout = payload_layout(h.codec, h.block, h.topk_k, h.elements);
  if (!h.topk()) {
    decode_values(h.codec, payload + layout.scales_offset, payload + layout.codes_offset, h.elements, h.block,
                  out.data(), codes_);
    return;
  }
  kept_.resize(layout.kept);
  decode_values(h.codec, payload + layout.scales_offset, payload + layout.codes_offset, layout.kept, layout.kept_full,
                kept_.data(), codes_);
  topk_scatter(payload + layout.index_offset, layout, h.block, kept_.data(), out);
}

FrameInfo Pipeline::inspect(std::span<const uint8_t> frame, uint64_t expected_elements) {
  const FrameHeader h = parse_header(frame, expected_elements);
  verify_checksum(frame, h);
  return info_of(h);
}

FrameInfo Pipeline::decode(std::span<const uint8_t> frame, uint64_t expected_elements, std::span<float> out) {
  GEOLOCO_CHECK(out.size() == expected_elements, "output has {} elements, expected {}", out.size(), expected_elements);
  const FrameHeader h = parse_header(frame, expected_elements);
  verify_checksum(frame, h);
  const uint8_t* payload = frame.data() + kHeaderBytes;
  if (h.zstd()) {
    // raw_bytes was checked against the layout of expected_elements: a bounded allocation.
    if (!zd_) zd_ = std::make_unique<ZstdDecompressor>();
    raw_.resize(h.raw_bytes);
    zd_->decompress(frame.subspan(kHeaderBytes, h.stored_bytes), raw_);
    payload = raw_.data();
  }
  decode_payload(h, payload, out);
  return info_of(h);
}

FrameInfo Pipeline::decode_add(std::span<const uint8_t> frame, uint64_t expected_elements, std::span<float> sum) {
  GEOLOCO_CHECK(sum.size() == expected_elements, "sum has {} elements, expected {}", sum.size(), expected_elements);
  // Decode fully into decoded_ first (decode() never uses it) so a throw leaves `sum` untouched.
  decoded_.resize(expected_elements);
  const FrameInfo info = decode(frame, expected_elements, decoded_);
  float* s = sum.data();
  const float* d = decoded_.data();
  for (size_t i = 0; i < expected_elements; ++i) s[i] += d[i];
  return info;
}

}  // namespace geoloco::compression

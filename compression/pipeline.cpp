#include "compression/pipeline.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>

#include "compression/bytes.hpp"
#include "compression/parallel.hpp"
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

// Elements per chunk of a frame's work on several threads: 1 MiB of fp32.
constexpr size_t kElementChunk = size_t{1} << 18;

// body(b, e) over [0, n) in chunks of kElementChunk on `threads` threads (elementwise passes).
void for_each_range(size_t n, int threads, const std::function<void(size_t, size_t)>& body) {
  const size_t chunks = (n + kElementChunk - 1) / kElementChunk;
  parallel_for(chunks, threads, [&](size_t c, int) { body(c * kElementChunk, std::min(n, (c + 1) * kElementChunk)); });
}

// A range of whole blocks of the payload, [b0, b1), of a multiple of 8 blocks (but the last):
// its coded values [v0, v1) (all the elements, or the kept ones with top-k) and where its
// scales and codes start in their sections. 8 blocks of any values-per-block count end on a
// byte of codes, so the ranges write disjoint bytes and may run on several threads.
struct CodedRange {
  uint64_t b0, b1, v0, v1, scales_at, codes_at;
};

std::vector<CodedRange> coded_ranges(const PayloadLayout& l, Codec codec, uint32_t block) {
  std::vector<CodedRange> out;
  const uint64_t step = std::max<uint64_t>(8, kElementChunk / block / 8 * 8);
  const uint64_t per_block = l.kept_full, bits = static_cast<uint64_t>(codec_bits(codec));
  const bool scaled = codec_has_scales(codec);
  for (uint64_t b0 = 0; b0 < l.blocks; b0 += step) {
    const uint64_t b1 = std::min(l.blocks, b0 + step);
    const uint64_t v0 = b0 * per_block, v1 = b1 == l.blocks ? l.kept : b1 * per_block;
    out.push_back({b0, b1, v0, v1, scaled ? b0 * 4 : 0, v0 * bits / 8});
  }
  return out;
}

}  // namespace

Pipeline::Pipeline(const PipelineConfig& config) : config_(config) {
  config_.validate();
  threads_ = config_.threads;
  if (config_.zstd_level > 0)
    for (int t = 0; t < threads_; ++t) zc_.push_back(std::make_unique<ZstdCompressor>(config_.zstd_level));
  zd_.resize(static_cast<size_t>(threads_));
  codes_.resize(static_cast<size_t>(threads_));
  topk_scratch_.resize(static_cast<size_t>(threads_));
}

void Pipeline::reserve(size_t elements) {
  if (config_.error_feedback) {
    corrected_.resize(std::max(corrected_.size(), elements));
    decoded_.resize(std::max(decoded_.size(), elements));
  }
  if (!zc_.empty()) {
    const PayloadLayout layout =
        payload_layout(config_.codec, config_.block, config_.topk ? config_.topk_per_block() : 0, elements);
    raw_.resize(std::max<size_t>(raw_.size(), layout.total));
  }
}

size_t Pipeline::compress_chunks(std::span<const uint8_t> raw, std::span<uint8_t> out) {
  const size_t n = (raw.size() + kZstdChunkBytes - 1) / kZstdChunkBytes;
  if (zchunks_.size() < n) zchunks_.resize(n);
  std::vector<size_t> sizes(n);
  parallel_for(n, threads_, [&](size_t c, int w) {
    const size_t b = c * kZstdChunkBytes, len = std::min<size_t>(kZstdChunkBytes, raw.size() - b);
    auto& buf = zchunks_[c];
    buf.resize(zstd_bound(len));
    // A chunk that does not shrink is still sent compressed (zstd stores it raw inside its
    // frame); only the whole payload falls back to raw.
    sizes[c] = zc_[static_cast<size_t>(w)]->compress_frame(raw.subspan(b, len), buf);
  });
  size_t total = 0;
  for (size_t z : sizes) total += z;
  if (total >= raw.size() || total > out.size()) return 0;
  size_t at = 0;
  for (size_t c = 0; c < n; ++c) {
    std::memcpy(out.data() + at, zchunks_[c].data(), sizes[c]);
    at += sizes[c];
  }
  return total;
}

void Pipeline::decompress_payload(const FrameHeader& h, std::span<const uint8_t> stored, std::span<uint8_t> out) {
  if (h.version < 2) {  // one zstd frame
    if (!zd_[0]) zd_[0] = std::make_unique<ZstdDecompressor>();
    zd_[0]->decompress(stored, out);
    return;
  }
  // Find every chunk's frame first (sizes only), then decompress them in parallel.
  const size_t n = (out.size() + kZstdChunkBytes - 1) / kZstdChunkBytes;
  std::vector<std::pair<size_t, size_t>> at(n);  // offset, size in `stored`
  size_t off = 0;
  for (size_t c = 0; c < n; ++c) {
    if (off >= stored.size())
      throw FrameError(FrameFault::kZstd, fmt::format("zstd payload ends after {} of {} chunks", c, n));
    const size_t z = zstd_frame_size(stored.subspan(off));
    at[c] = {off, z};
    off += z;
  }
  if (off != stored.size())
    throw FrameError(FrameFault::kZstd, fmt::format("zstd payload: {} chunks take {} of its {} bytes (trailing data)",
                                                    n, off, stored.size()));
  parallel_for(n, threads_, [&](size_t c, int w) {
    auto& zd = zd_[static_cast<size_t>(w)];
    if (!zd) zd = std::make_unique<ZstdDecompressor>();
    const size_t b = c * kZstdChunkBytes, len = std::min<size_t>(kZstdChunkBytes, out.size() - b);
    try {
      zd->decompress(stored.subspan(at[c].first, at[c].second), out.subspan(b, len));
    } catch (const FrameError& e) {
      throw FrameError(e.fault(), fmt::format("zstd chunk {} of {}: {}", c, n, e.what()));
    }
  });
}

FrameInfo Pipeline::encode(std::span<const float> values, ErrorFeedback* ef, std::vector<uint8_t>& frame_out,
                           size_t at) {
  GEOLOCO_CHECK((ef != nullptr) == config_.error_feedback,
                "error feedback is {} in the config but encode got {} residual", config_.error_feedback ? "on" : "off",
                ef ? "a" : "no");
  if (ef)
    GEOLOCO_CHECK(ef->size() == values.size(), "error-feedback residual has {} elements, the shard {}", ef->size(),
                  values.size());
  return encode_impl(values, ef ? ef->residual() : std::span<float>(), ef != nullptr, frame_out, at);
}

FrameInfo Pipeline::encode_with_residual(std::span<const float> values, std::span<float> residual,
                                         std::vector<uint8_t>& frame_out, size_t at) {
  GEOLOCO_CHECK(config_.error_feedback, "encode_with_residual: error feedback is off in the config");
  GEOLOCO_CHECK(residual.size() == values.size(), "error-feedback residual has {} elements, the part {}",
                residual.size(), values.size());
  return encode_impl(values, residual, true, frame_out, at);
}

FrameInfo Pipeline::encode_impl(std::span<const float> values, std::span<float> residual, bool with_ef,
                                std::vector<uint8_t>& frame_out, size_t at) {
  float* const ef = with_ef ? residual.data() : nullptr;
  const uint64_t n = values.size();
  if (n > kMaxElements) throw Error(fmt::format("compression: shard of {} elements exceeds 2^40", n));
  std::span<const float> input = values;
  if (with_ef) {
    corrected_.resize(n);
    const float* r = ef;
    for_each_range(n, threads_, [&](size_t b, size_t e) {
      if (config_.error_feedback_decay < 1.0) {
        const float beta = static_cast<float>(config_.error_feedback_decay);
        for (size_t i = b; i < e; ++i) corrected_[i] = values[i] + beta * r[i];
      } else {
        for (size_t i = b; i < e; ++i) corrected_[i] = values[i] + r[i];
      }
    });
    input = corrected_;
  }
  std::atomic<bool> in_range{true};
  for_each_range(n, threads_, [&](size_t b, size_t e) {
    if (!all_in_range(input.data() + b, e - b)) in_range = false;
  });
  if (!in_range) {
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
  PayloadLayout layout;
  begin_header(h, n, layout);
  uint8_t* raw = payload_buffer(layout, frame_out, at);
  // Top-k selection (into kept_) and the value codec, range by range (coded_ranges).
  const auto ranges = coded_ranges(layout, h.codec, h.block);
  if (h.topk()) kept_.resize(layout.kept);
  const float* coded = h.topk() ? kept_.data() : input.data();
  parallel_for(ranges.size(), threads_, [&](size_t c, int w) {
    const CodedRange& r = ranges[c];
    if (h.topk())
      topk_select(input, layout, h.block, raw + layout.index_offset, kept_.data(),
                  topk_scratch_[static_cast<size_t>(w)], r.b0, r.b1);
    encode_values(h.codec, std::span<const float>(coded + r.v0, r.v1 - r.v0), layout.kept_full,
                  raw + layout.scales_offset + r.scales_at, raw + layout.codes_offset + r.codes_at,
                  codes_[static_cast<size_t>(w)]);
  });

  if (with_ef) {
    // The residual is measured against exactly what receivers decode from these bytes
    // (decoded now, while `raw` is certainly valid; committed once the frame is complete).
    decoded_.resize(n);
    decode_payload(h, raw, decoded_);
  }

  const FrameInfo info = finish_frame(h, layout, raw, frame_out, at);
  if (with_ef) {
    for_each_range(n, threads_, [&](size_t b, size_t e) {
      for (size_t i = b; i < e; ++i) ef[i] = corrected_[i] - decoded_[i];
    });
  }
  return info;
}

size_t Pipeline::max_frame_bytes(uint64_t elements) const {
  FrameHeader h;
  PayloadLayout layout;
  begin_header(h, elements, layout);
  return kHeaderBytes + layout.total + kTrailerBytes;
}

void Pipeline::begin_header(FrameHeader& h, uint64_t elements, PayloadLayout& layout) const {
  h.codec = config_.codec;
  h.block = config_.block;
  h.topk_k = config_.topk ? config_.topk_per_block() : 0;
  h.flags = config_.topk ? kFlagTopk : 0;
  h.elements = elements;
  layout = payload_layout(h.codec, h.block, h.topk_k, elements);
  h.raw_bytes = layout.total;
}

uint8_t* Pipeline::payload_buffer(const PayloadLayout& layout, std::vector<uint8_t>& frame_out, size_t at) {
  // Without zstd the payload is built in place in the frame; with it, in raw_ first.
  if (!zc_.empty()) {
    raw_.resize(layout.total);
    return raw_.data();
  }
  frame_out.resize(at + kHeaderBytes + layout.total + kTrailerBytes);
  return frame_out.data() + at + kHeaderBytes;
}

FrameInfo Pipeline::finish_frame(FrameHeader& h, const PayloadLayout& layout, const uint8_t* raw,
                                 std::vector<uint8_t>& frame_out, size_t at) {
  size_t stored = layout.total;
  if (!zc_.empty() && layout.total > 0) {
    frame_out.resize(at + kHeaderBytes + layout.total + kTrailerBytes);
    const size_t z = compress_chunks({raw, layout.total}, {frame_out.data() + at + kHeaderBytes, layout.total - 1});
    if (z > 0) {
      stored = z;
      h.flags |= kFlagZstd;
    } else {
      std::memcpy(frame_out.data() + at + kHeaderBytes, raw, layout.total);
    }
  } else if (!zc_.empty()) {
    frame_out.resize(at + kHeaderBytes + kTrailerBytes);
  }
  h.stored_bytes = stored;
  frame_out.resize(at + h.frame_bytes());
  uint8_t* const frame = frame_out.data() + at;
  write_header(h, frame);
  const size_t body = kHeaderBytes + stored;
  bytes::store<uint64_t>(frame + body, frame_checksum({frame, body}));
  const FrameInfo info = info_of(h);
  totals_.add(info);
  return info;
}

FrameInfo Pipeline::encode_staged(std::span<const uint8_t> scales, std::span<const uint8_t> codes, uint64_t elements,
                                  std::vector<uint8_t>& frame_out, size_t at) {
  if (config_.topk || !codec_has_scales(config_.codec))
    throw Error(
        fmt::format("compression: a staged payload needs a dense scaled codec (int8, int4, fp4, int2), "
                    "not {}{}",
                    codec_name(config_.codec), config_.topk ? " with top-k" : ""));
  if (elements > kMaxElements) throw Error(fmt::format("compression: shard of {} elements exceeds 2^40", elements));
  FrameHeader h;
  PayloadLayout layout;
  begin_header(h, elements, layout);
  if (scales.size() != layout.scales_bytes || codes.size() != layout.codes_bytes)
    throw Error(fmt::format("compression: staged payload of {} scale and {} code bytes; {} {} values take {} and {}",
                            scales.size(), codes.size(), elements, codec_name(config_.codec), layout.scales_bytes,
                            layout.codes_bytes));
  uint8_t* raw = payload_buffer(layout, frame_out, at);
  if (!scales.empty()) std::memcpy(raw + layout.scales_offset, scales.data(), scales.size());
  if (!codes.empty()) std::memcpy(raw + layout.codes_offset, codes.data(), codes.size());
  return finish_frame(h, layout, raw, frame_out, at);
}

void Pipeline::decode_payload(const FrameHeader& h, const uint8_t* payload, std::span<float> out) {
  const PayloadLayout layout = payload_layout(h.codec, h.block, h.topk_k, h.elements);
  const auto ranges = coded_ranges(layout, h.codec, h.block);
  if (h.topk()) kept_.resize(layout.kept);
  float* values = h.topk() ? kept_.data() : out.data();
  parallel_for(ranges.size(), threads_, [&](size_t c, int w) {
    const CodedRange& r = ranges[c];
    decode_values(h.codec, payload + layout.scales_offset + r.scales_at, payload + layout.codes_offset + r.codes_at,
                  r.v1 - r.v0, layout.kept_full, values + r.v0, codes_[static_cast<size_t>(w)]);
    if (h.topk()) topk_scatter(payload + layout.index_offset, layout, h.block, kept_.data(), out, r.b0, r.b1);
  });
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
    raw_.resize(h.raw_bytes);
    decompress_payload(h, frame.subspan(kHeaderBytes, h.stored_bytes), raw_);
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
  for_each_range(expected_elements, threads_, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) s[i] += d[i];
  });
  return info;
}

}  // namespace geoloco::compression

// Pipeline: what the outer loop calls per shard per outer step.
//
//   sender:    pipeline.encode(pseudo_grad_shard, &ef, frame)        -> send frame
//   every site, for every site s in rank order (its own frame included):
//              pipeline.decode_add(frame[s], shard_elements, sum)    -> fp32 sum, fixed order
//
// Every site decodes the same bytes with the same code and adds them in the same order, so
// all sites hold bit-identical sums (docs/compression.md explains this choice). A site must
// add the decoded form of its own frame, not its raw values.
//
// Pipeline objects hold scratch buffers and zstd contexts: one per thread, not shared. With
// config().threads > 1 a Pipeline runs each frame's work on that many threads of its own
// (parallel.hpp): element chunks of the dense codecs, block ranges of top-k, zstd chunks. A
// frame's bytes do not depend on the thread count.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "compression/config.hpp"
#include "compression/encode_error.hpp"
#include "compression/error_feedback.hpp"
#include "compression/frame.hpp"
#include "compression/zstd_stage.hpp"

namespace geoloco::compression {

// What one frame carried (from the encoder, or from a validated header).
struct FrameInfo {
  Codec codec = Codec::kFp32;
  bool topk = false;
  bool zstd = false;  // zstd applied (it is skipped for a frame it would not shrink)
  uint64_t elements = 0;
  uint64_t raw_bytes = 0;    // payload before zstd
  uint64_t frame_bytes = 0;  // bytes on the wire: header + stored payload + checksum
  // fp32 bytes of the same values divided by bytes on the wire.
  double ratio() const { return frame_bytes ? 4.0 * static_cast<double>(elements) / frame_bytes : 0.0; }
};

// Running totals of what was encoded, for summary.json ("bytes on the wire per outer step":
// frame_bytes / outer steps; "compression ratio": ratio()). Sum several pipelines' totals
// (one per thread) with +=.
struct WireTotals {
  uint64_t frames = 0;
  uint64_t elements = 0;
  uint64_t frame_bytes = 0;
  double ratio() const { return frame_bytes ? 4.0 * static_cast<double>(elements) / frame_bytes : 0.0; }
  void add(const FrameInfo& f) {
    frames += 1;
    elements += f.elements;
    frame_bytes += f.frame_bytes;
  }
  WireTotals& operator+=(const WireTotals& o) {
    frames += o.frames;
    elements += o.elements;
    frame_bytes += o.frame_bytes;
    return *this;
  }
};

class Pipeline {
 public:
  // Throws ConfigError for an invalid config (PipelineConfig::validate).
  explicit Pipeline(const PipelineConfig& config);
  const PipelineConfig& config() const { return config_; }

  // Encodes one shard into `frame_out` (resized to the frame). `ef` must be non-null exactly
  // when config().error_feedback is set; it is read (added to `values`) and updated to what
  // this frame dropped. Throws EncodeError for a non-finite value or |value| > 2^64 (after
  // adding the residual), naming the index (and for an fp16 overflow); `ef` is then unchanged.
  // `at`: the frame is written from frame_out[at] on, the `at` bytes before it kept (room for
  // the caller's header: the outer loop's envelope is built around the frame, not copied).
  FrameInfo encode(std::span<const float> values, ErrorFeedback* ef, std::vector<uint8_t>& frame_out, size_t at = 0);
  // As encode() with error feedback on `residual` (values.size() elements, e.g. the part of a
  // shard's residual that belongs to a part of the shard encoded as its own frame);
  // config().error_feedback must be set.
  FrameInfo encode_with_residual(std::span<const float> values, std::span<float> residual,
                                 std::vector<uint8_t>& frame_out, size_t at = 0);

  // The frame of `elements` values quantized elsewhere (a GPU: trainer/cuda/quantize_kernel.hpp)
  // from their scales (one little-endian fp32 per block) and packed codes: the bytes encode()
  // makes of the same values (the payload laid out, zstd, header, checksum). A dense scaled
  // codec only (int8, int4, fp4, int2; no top-k): else Error. Throws Error when the sizes do
  // not match the layout of `elements` values.
  FrameInfo encode_staged(std::span<const uint8_t> scales, std::span<const uint8_t> codes, uint64_t elements,
                          std::vector<uint8_t>& frame_out, size_t at = 0);

  // Decodes a frame of any codec into out (out.size() == expected_elements). Throws
  // FrameError on any malformed input, including a frame whose element count differs from
  // expected_elements. `out` is unspecified after a throw.
  FrameInfo decode(std::span<const uint8_t> frame, uint64_t expected_elements, std::span<float> out);
  // sum[i] += decoded[i] in fp32. Validates the whole frame before touching `sum`, so a
  // malformed frame leaves `sum` unchanged.
  FrameInfo decode_add(std::span<const uint8_t> frame, uint64_t expected_elements, std::span<float> sum);

  // Validates header and checksum (not the payload) and reports what the frame holds.
  static FrameInfo inspect(std::span<const uint8_t> frame, uint64_t expected_elements);

  // The largest frame encode() makes of `elements` values under this config (zstd kept only
  // when it shrinks the payload): to reserve a buffer the frame will not outgrow.
  size_t max_frame_bytes(uint64_t elements) const;

  const WireTotals& encoded_totals() const { return totals_; }
  // Sizes (and touches) the scratch a frame of `elements` needs, so the first encode of a
  // large shard does not pay its page faults on the sync's path.
  void reserve(size_t elements);

 private:
  // encode(), with error feedback on `residual` (values.size() elements) when `with_ef`.
  FrameInfo encode_impl(std::span<const float> values, std::span<float> residual, bool with_ef,
                        std::vector<uint8_t>& frame_out, size_t at);
  // The header `h` (codec, block, top-k, elements set) completed from the config and layout.
  void begin_header(FrameHeader& h, uint64_t elements, PayloadLayout& layout) const;
  // Where the raw payload of `layout` is built: in place in `frame_out` without zstd, else in
  // raw_ (finish_frame compresses it into the frame).
  uint8_t* payload_buffer(const PayloadLayout& layout, std::vector<uint8_t>& frame_out, size_t at);
  // zstd (when on and it shrinks the payload), header and checksum around the raw payload.
  FrameInfo finish_frame(FrameHeader& h, const PayloadLayout& layout, const uint8_t* raw,
                         std::vector<uint8_t>& frame_out, size_t at);
  // Decodes the raw (pre-zstd) payload described by `h` into out.
  void decode_payload(const FrameHeader& h, const uint8_t* payload, std::span<float> out);

  // zstd over the raw payload in kZstdChunkBytes chunks into `out` (capacity raw.size() - 1);
  // 0 when the chunks together would not be smaller than the raw payload.
  size_t compress_chunks(std::span<const uint8_t> raw, std::span<uint8_t> out);
  // A version-2 payload's chunks back into `out` (raw_bytes); version 1: one zstd frame.
  void decompress_payload(const FrameHeader& h, std::span<const uint8_t> stored, std::span<uint8_t> out);

  PipelineConfig config_;
  int threads_ = 1;
  std::vector<std::unique_ptr<ZstdCompressor>> zc_;    // one per thread (zstd on)
  std::vector<std::unique_ptr<ZstdDecompressor>> zd_;  // one per thread, made when needed
  WireTotals totals_;
  // Scratch, reused across calls.
  std::vector<float> corrected_;
  std::vector<float> kept_;
  std::vector<float> decoded_;
  std::vector<uint8_t> raw_;
  std::vector<std::vector<uint8_t>> codes_;          // per thread
  std::vector<std::vector<uint8_t>> zchunks_;        // per zstd chunk: its compressed bytes
  std::vector<std::vector<uint32_t>> topk_scratch_;  // per thread
};

}  // namespace geoloco::compression

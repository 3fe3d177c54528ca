// The compressed frame: one shard's pseudo-gradient for one outer step, self-describing.
// Byte layout (little-endian; see compression/README.md):
//
//   off size field
//     0    4 magic "GLCF"
//     4    2 version (2; 1 is still read)
//     6    1 codec id (compression/codec.hpp)
//     7    1 flags: bit 0 top-k, bit 1 zstd; other bits must be 0
//     8    4 block: elements per scale / top-k block (16..65536, multiple of 8)
//    12    4 topk_k: values kept per full block (1..block) with top-k, else 0
//    16    8 elements: values in the shard
//    24    8 raw_bytes: payload size before zstd (must equal the size the layout implies)
//    32    8 stored_bytes: payload size on the wire (== raw_bytes without zstd)
//    40    . payload (stored_bytes); with zstd (version 2), the raw payload cut in chunks of
//              kZstdChunkBytes (the last shorter), each its own zstd frame, back to back
//              (version 1: one zstd frame), so chunks compress and decompress in parallel
//     .    8 checksum: XXH3-64 (seed kChecksumSeed) of every byte before it
//
// The decoder trusts nothing: parse_header checks every field and every size against the
// caller's expected element count before anything is allocated or read past the header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "compression/codec.hpp"
#include "core/error.hpp"

namespace geoloco::compression {

inline constexpr uint8_t kFrameMagic[4] = {'G', 'L', 'C', 'F'};
inline constexpr uint16_t kFrameVersion = 2;
inline constexpr uint16_t kOldestFrameVersion = 1;
// Raw payload bytes per zstd chunk (version 2). Part of the format: never change it.
inline constexpr uint64_t kZstdChunkBytes = uint64_t{1} << 20;
inline constexpr size_t kHeaderBytes = 40;
inline constexpr size_t kTrailerBytes = 8;
inline constexpr uint64_t kChecksumSeed = 0x474c4346'00000001ULL;
inline constexpr uint8_t kFlagTopk = 1;
inline constexpr uint8_t kFlagZstd = 2;
// Shards above 2^40 elements are refused, which keeps all size arithmetic below 2^44.
inline constexpr uint64_t kMaxElements = uint64_t{1} << 40;

// What was wrong with a frame. Stable names (fault_name) are used by the fuzz corpus.
enum class FrameFault : uint8_t {
  kTruncated,  // shorter than its header or than the sizes it declares
  kMagic,
  kVersion,
  kCodec,         // unknown codec id
  kFlags,         // unknown flag bits
  kBlock,         // block size out of range / not a multiple of 8
  kTopk,          // topk_k inconsistent with the flags or the block
  kElementCount,  // element count differs from what the shard expects
  kSize,          // raw/stored sizes inconsistent with the layout or the frame length
  kChecksum,
  kZstd,     // zstd payload malformed or not of the declared size
  kPayload,  // invalid code, scale, index or padding inside the payload
};
std::string_view fault_name(FrameFault f);

class FrameError : public Error {
 public:
  FrameError(FrameFault fault, const std::string& detail);
  FrameFault fault() const { return fault_; }

 private:
  FrameFault fault_;
};

struct FrameHeader {
  uint16_t version = kFrameVersion;
  Codec codec = Codec::kFp32;
  uint8_t flags = 0;
  uint32_t block = 0;
  uint32_t topk_k = 0;
  uint64_t elements = 0;
  uint64_t raw_bytes = 0;
  uint64_t stored_bytes = 0;

  bool topk() const { return flags & kFlagTopk; }
  bool zstd() const { return flags & kFlagZstd; }
  uint64_t frame_bytes() const { return kHeaderBytes + stored_bytes + kTrailerBytes; }
};

// Where each section of the raw (pre-zstd) payload lies. Everything follows from
// (codec, block, topk_k, elements); nothing in the payload describes itself.
//   [index section, top-k only][scales: blocks x f32, scaled codecs only][codes, bit-packed]
// Index section: per block, either a bitmap of the block's length (rounded up to bytes) or
// its kept indices ascending as fixed-width (bit_width(block-1)) fields, whichever is
// smaller (the bitmap on ties); each block's entry starts on a byte boundary.
struct PayloadLayout {
  uint64_t blocks = 0;
  uint32_t last_len = 0;     // length of the last block (== block unless n % block != 0)
  uint32_t kept_full = 0;    // values kept per full block (block without top-k)
  uint32_t kept_last = 0;    // values kept in the last block: ceil(topk_k * last_len / block)
  uint64_t kept = 0;         // values coded in total
  int index_width = 0;       // bits per packed index
  bool bitmap_full = false;  // index format of full blocks
  bool bitmap_last = false;  // index format of the last block
  uint64_t index_bytes_full = 0;
  uint64_t index_bytes_last = 0;
  uint64_t index_offset = 0, index_bytes = 0;
  uint64_t scales_offset = 0, scales_bytes = 0;
  uint64_t codes_offset = 0, codes_bytes = 0;
  uint64_t total = 0;
};
// topk_k == 0 means dense. Preconditions (checked by parse_header / the encoder):
// block in range, topk_k <= block, elements <= kMaxElements.
PayloadLayout payload_layout(Codec codec, uint32_t block, uint32_t topk_k, uint64_t elements);

void write_header(const FrameHeader& h, uint8_t* out);
// Validates the header and every declared size against frame.size() and expected_elements.
// Does not read the payload or verify the checksum (see verify_checksum).
FrameHeader parse_header(std::span<const uint8_t> frame, uint64_t expected_elements);
// Throws FrameError(kChecksum) unless the trailer matches; call after parse_header.
void verify_checksum(std::span<const uint8_t> frame, const FrameHeader& h);
uint64_t frame_checksum(std::span<const uint8_t> frame_without_trailer);

}  // namespace geoloco::compression

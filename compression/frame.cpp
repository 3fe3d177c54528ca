#include "compression/frame.hpp"

#include <fmt/format.h>

#include <array>
#include <bit>
#include <cstring>

#include "compression/bytes.hpp"
#include "compression/config.hpp"
#include "core/hash.hpp"

namespace geoloco::compression {

namespace {
constexpr std::array<std::string_view, 12> kFaultNames = {
    "truncated", "magic", "version", "codec", "flags", "block", "topk", "count", "size", "checksum", "zstd", "payload"};

uint64_t ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }
}  // namespace

std::string_view fault_name(FrameFault f) { return kFaultNames.at(static_cast<size_t>(f)); }

FrameError::FrameError(FrameFault fault, const std::string& detail)
    : Error(fmt::format("malformed compressed frame ({}): {}", fault_name(fault), detail)), fault_(fault) {}

PayloadLayout payload_layout(Codec codec, uint32_t block, uint32_t topk_k, uint64_t n) {
  PayloadLayout l;
  l.blocks = ceil_div(n, block);
  l.last_len = n == 0 ? 0 : static_cast<uint32_t>(n - (l.blocks - 1) * block);
  if (topk_k == 0) {
    l.kept_full = block;
    l.kept_last = l.last_len;
    l.kept = n;
  } else {
    l.kept_full = topk_k;
    // The last, shorter block keeps the same fraction, rounded up (at least one value).
    l.kept_last = n == 0 ? 0 : static_cast<uint32_t>(ceil_div(uint64_t{topk_k} * l.last_len, block));
    l.kept = n == 0 ? 0 : (l.blocks - 1) * topk_k + l.kept_last;
    l.index_width = std::bit_width(block - 1);
    const uint64_t packed_full = ceil_div(uint64_t{topk_k} * l.index_width, 8);
    const uint64_t bitmap_full = block / 8;
    l.bitmap_full = bitmap_full <= packed_full;
    l.index_bytes_full = l.bitmap_full ? bitmap_full : packed_full;
    const uint64_t packed_last = ceil_div(uint64_t{l.kept_last} * l.index_width, 8);
    const uint64_t bitmap_last = ceil_div(l.last_len, 8);
    l.bitmap_last = bitmap_last <= packed_last;
    l.index_bytes_last = n == 0 ? 0 : (l.bitmap_last ? bitmap_last : packed_last);
    l.index_bytes = n == 0 ? 0 : (l.blocks - 1) * l.index_bytes_full + l.index_bytes_last;
  }
  l.index_offset = 0;
  l.scales_offset = l.index_bytes;
  l.scales_bytes = codec_has_scales(codec) ? l.blocks * sizeof(float) : 0;
  l.codes_offset = l.scales_offset + l.scales_bytes;
  l.codes_bytes = ceil_div(l.kept * static_cast<uint64_t>(codec_bits(codec)), 8);
  l.total = l.codes_offset + l.codes_bytes;
  return l;
}

void write_header(const FrameHeader& h, uint8_t* out) {
  std::memcpy(out, kFrameMagic, 4);
  bytes::store<uint16_t>(out + 4, kFrameVersion);
  out[6] = static_cast<uint8_t>(h.codec);
  out[7] = h.flags;
  bytes::store<uint32_t>(out + 8, h.block);
  bytes::store<uint32_t>(out + 12, h.topk_k);
  bytes::store<uint64_t>(out + 16, h.elements);
  bytes::store<uint64_t>(out + 24, h.raw_bytes);
  bytes::store<uint64_t>(out + 32, h.stored_bytes);
}

FrameHeader parse_header(std::span<const uint8_t> frame, uint64_t expected_elements) {
  const uint8_t* p = frame.data();
  if (frame.size() < kHeaderBytes + kTrailerBytes)
    throw FrameError(FrameFault::kTruncated,
                     fmt::format("{} bytes, a frame has at least {}", frame.size(), kHeaderBytes + kTrailerBytes));
  if (std::memcmp(p, kFrameMagic, 4) != 0)
    throw FrameError(FrameFault::kMagic,
                     fmt::format("magic {:02x}{:02x}{:02x}{:02x}, expected 'GLCF'", p[0], p[1], p[2], p[3]));
  const uint16_t version = bytes::load<uint16_t>(p + 4);
  if (version < kOldestFrameVersion || version > kFrameVersion)
    throw FrameError(FrameFault::kVersion,
                     fmt::format("version {}, this build reads {} to {}", version, kOldestFrameVersion, kFrameVersion));
  FrameHeader h;
  h.version = version;
  const auto codec = codec_from_id(p[6]);
  if (!codec) throw FrameError(FrameFault::kCodec, fmt::format("unknown codec id {}", p[6]));
  h.codec = *codec;
  h.flags = p[7];
  if (h.flags & ~(kFlagTopk | kFlagZstd))
    throw FrameError(FrameFault::kFlags, fmt::format("unknown flag bits 0x{:02x}", h.flags));
  h.block = bytes::load<uint32_t>(p + 8);
  if (h.block < kMinBlock || h.block > kMaxBlock || h.block % 8 != 0)
    throw FrameError(FrameFault::kBlock,
                     fmt::format("block {}, expected a multiple of 8 in [{}, {}]", h.block, kMinBlock, kMaxBlock));
  h.topk_k = bytes::load<uint32_t>(p + 12);
  if (h.topk() ? (h.topk_k < 1 || h.topk_k > h.block) : h.topk_k != 0)
    throw FrameError(FrameFault::kTopk,
                     fmt::format("topk_k {} with block {} and top-k {}", h.topk_k, h.block, h.topk() ? "on" : "off"));
  h.elements = bytes::load<uint64_t>(p + 16);
  if (h.elements != expected_elements)
    throw FrameError(FrameFault::kElementCount,
                     fmt::format("frame claims {} elements, the shard expects {}{}", h.elements, expected_elements,
                                 h.elements > expected_elements ? " (more than the shard holds)" : ""));
  if (h.elements > kMaxElements)
    throw FrameError(FrameFault::kElementCount, fmt::format("{} elements exceed the limit 2^40", h.elements));
  h.raw_bytes = bytes::load<uint64_t>(p + 24);
  h.stored_bytes = bytes::load<uint64_t>(p + 32);
  const PayloadLayout layout = payload_layout(h.codec, h.block, h.topk_k, h.elements);
  if (h.raw_bytes != layout.total)
    throw FrameError(FrameFault::kSize, fmt::format("raw_bytes {}, the layout of {} {} elements needs {}", h.raw_bytes,
                                                    codec_name(h.codec), h.elements, layout.total));
  if (h.zstd()) {
    // The encoder only keeps zstd output that is smaller than the raw payload.
    if (h.stored_bytes == 0 || h.stored_bytes >= h.raw_bytes)
      throw FrameError(FrameFault::kSize,
                       fmt::format("zstd stored_bytes {} not in [1, raw_bytes {})", h.stored_bytes, h.raw_bytes));
  } else if (h.stored_bytes != h.raw_bytes) {
    throw FrameError(FrameFault::kSize,
                     fmt::format("stored_bytes {} != raw_bytes {} without zstd", h.stored_bytes, h.raw_bytes));
  }
  // stored_bytes < raw_bytes <= 2^44 here, so frame_bytes() cannot overflow.
  if (frame.size() < h.frame_bytes())
    throw FrameError(FrameFault::kTruncated,
                     fmt::format("{} bytes, the header declares {}", frame.size(), h.frame_bytes()));
  if (frame.size() > h.frame_bytes())
    throw FrameError(FrameFault::kSize,
                     fmt::format("{} bytes, the header declares {} (trailing bytes)", frame.size(), h.frame_bytes()));
  return h;
}

uint64_t frame_checksum(std::span<const uint8_t> frame_without_trailer) {
  return hash64(frame_without_trailer.data(), frame_without_trailer.size(), kChecksumSeed);
}

void verify_checksum(std::span<const uint8_t> frame, const FrameHeader& h) {
  const size_t body = kHeaderBytes + h.stored_bytes;
  const uint64_t want = bytes::load<uint64_t>(frame.data() + body);
  const uint64_t got = frame_checksum(frame.first(body));
  if (want != got)
    throw FrameError(FrameFault::kChecksum,
                     fmt::format("checksum {} in the frame, {} computed", hex64(want), hex64(got)));
}

}  // namespace geoloco::compression

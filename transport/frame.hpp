// The data frame: every chunk of every transfer travels as one UCX active message whose
// user header is this fixed 56-byte, little-endian FrameHeader and whose data is the chunk.
//
//   off size field
//     0    4 magic         'GLTF' (0x46544C47)
//     4    2 version       kFrameVersion
//     6    2 kind          FrameKind
//     8    8 round         outer round the transfer belongs to
//    16    4 shard         shard (fragment) index within the round
//    20    4 flags         kFrameFlag* bits; others must be 0
//    24    8 offset        byte offset of this chunk in the whole transfer
//    32    8 length        bytes in this chunk (== the active message's data length)
//    40    8 total_length  bytes in the whole transfer
//    48    8 checksum      XXH3-64 (seed 0) of the chunk's bytes
//
// Chunking rule (both peers agree on chunk_bytes at the handshake): chunk i covers
// [i*chunk, min((i+1)*chunk, total)); a zero-byte transfer is one frame with offset 0,
// length 0. So every header can be checked on its own, before anything is copied.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace geoloco::transport {

inline constexpr uint32_t kFrameMagic = 0x46544C47;  // "GLTF" little-endian
inline constexpr uint16_t kFrameVersion = 2;         // 2: flags (was reserved) and credit frames

// The sender counted this message against the receiver's eager window (transport.eager_bytes):
// the receiver returns its bytes in a credit frame once it holds them no longer.
inline constexpr uint32_t kFrameFlagEagerCredit = 1;
inline constexpr uint32_t kKnownFrameFlags = kFrameFlagEagerCredit;
inline constexpr size_t kFrameHeaderBytes = 56;

enum class FrameKind : uint16_t {
  kPseudoGradient = 1,  // compressed pseudo-gradient slice (outer sync)
  kGlobalState = 2,     // global weights / outer optimizer state (join, resync)
  kProbe = 3,           // planner bandwidth/latency probes
  kControl = 4,         // small control messages of the outer loop
  kCredit = 5,          // transport-internal: `round` returns that many eager-window bytes;
                        // header only (offset, length, total 0), never matched to a recv
  kAverage = 6,         // outer.exchange: owner: an owner's compressed average of its slice
};
std::string_view to_string(FrameKind kind);
bool is_valid_kind(uint16_t kind);

struct FrameHeader {
  uint32_t magic = kFrameMagic;
  uint16_t version = kFrameVersion;
  uint16_t kind = 0;
  uint64_t round = 0;
  uint32_t shard = 0;
  uint32_t flags = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t total_length = 0;
  uint64_t checksum = 0;

  void encode(uint8_t out[kFrameHeaderBytes]) const;
  // Decodes exactly kFrameHeaderBytes; nullopt when the size is wrong.
  static std::optional<FrameHeader> decode(std::span<const uint8_t> in);
};

// Number of chunks a transfer of `total` bytes is cut into (>= 1).
uint64_t chunk_count(uint64_t total, uint64_t chunk_bytes);

// Checks what a header must satisfy on its own: magic, version, kind, flags, the
// chunking rule, total <= max_total, and that the message carried exactly `length` bytes.
// Returns an empty string when valid, otherwise "field: problem".
std::string validate_header(const FrameHeader& h, uint64_t data_length, uint64_t chunk_bytes, uint64_t max_total);

uint64_t chunk_checksum(std::span<const uint8_t> data);

}  // namespace geoloco::transport

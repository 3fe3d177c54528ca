// The data frame header: encoding, the chunking rule, header validation (frame.hpp).
#include "transport/frame.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "core/hash.hpp"
#include "transport/wire.hpp"

namespace geoloco::transport {

std::string_view to_string(FrameKind kind) {
  switch (kind) {
    case FrameKind::kPseudoGradient: return "pseudo_gradient";
    case FrameKind::kGlobalState: return "global_state";
    case FrameKind::kProbe: return "probe";
    case FrameKind::kControl: return "control";
    case FrameKind::kCredit: return "credit";
    case FrameKind::kAverage: return "average";
  }
  return "unknown";
}

bool is_valid_kind(uint16_t kind) { return kind >= 1 && kind <= 6; }

void FrameHeader::encode(uint8_t out[kFrameHeaderBytes]) const {
  wire::Writer w;
  w.buffer().reserve(kFrameHeaderBytes);
  w.u32(magic);
  w.u16(version);
  w.u16(kind);
  w.u64(round);
  w.u32(shard);
  w.u32(flags);
  w.u64(offset);
  w.u64(length);
  w.u64(total_length);
  w.u64(checksum);
  std::memcpy(out, w.buffer().data(), kFrameHeaderBytes);
}

std::optional<FrameHeader> FrameHeader::decode(std::span<const uint8_t> in) {
  if (in.size() != kFrameHeaderBytes) return std::nullopt;
  wire::Reader r(in);
  FrameHeader h;
  bool ok = r.u32(h.magic) && r.u16(h.version) && r.u16(h.kind) && r.u64(h.round) && r.u32(h.shard) && r.u32(h.flags) &&
            r.u64(h.offset) && r.u64(h.length) && r.u64(h.total_length) && r.u64(h.checksum);
  if (!ok) return std::nullopt;
  return h;
}

uint64_t chunk_count(uint64_t total, uint64_t chunk_bytes) {
  if (total == 0) return 1;
  return (total + chunk_bytes - 1) / chunk_bytes;
}

std::string validate_header(const FrameHeader& h, uint64_t data_length, uint64_t chunk_bytes, uint64_t max_total) {
  if (h.magic != kFrameMagic) return fmt::format("magic: got {:#010x}, expected {:#010x}", h.magic, kFrameMagic);
  if (h.version != kFrameVersion) return fmt::format("version: got {}, expected {}", h.version, kFrameVersion);
  if (!is_valid_kind(h.kind)) return fmt::format("kind: got {}, not a known frame kind", h.kind);
  if ((h.flags & ~kKnownFrameFlags) != 0) return fmt::format("flags: got {:#x}, unknown bits set", h.flags);
  if (h.kind == static_cast<uint16_t>(FrameKind::kCredit) &&
      (h.offset != 0 || h.length != 0 || h.total_length != 0 || h.shard != 0 || h.flags != 0 || data_length != 0))
    return "credit frame: offset, length, total_length, shard and flags must be 0 and it carries no data";
  if (h.total_length > max_total)
    return fmt::format("total_length: got {}, exceeds the limit {}", h.total_length, max_total);
  if (h.offset % chunk_bytes != 0 || h.offset >= std::max<uint64_t>(h.total_length, 1))
    return fmt::format("offset: got {}, not a chunk boundary below total_length {} (chunk {})", h.offset,
                       h.total_length, chunk_bytes);
  uint64_t expected_len = std::min(chunk_bytes, h.total_length - std::min(h.offset, h.total_length));
  if (h.length != expected_len)
    return fmt::format("length: got {}, expected {} at offset {} of {}", h.length, expected_len, h.offset,
                       h.total_length);
  if (data_length != h.length)
    return fmt::format("length: header says {} bytes, message carried {} (truncated or padded)", h.length, data_length);
  return {};
}

uint64_t chunk_checksum(std::span<const uint8_t> data) { return hash64(data.data(), data.size(), 0); }

}  // namespace geoloco::transport

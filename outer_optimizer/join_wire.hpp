// The wire of a join (docs/elastic.md, "Rejoin and join"): what a joining rank and the ranks
// that donate the committed state to it exchange, every message an enveloped control message
// (envelope.hpp) between rank r of the joiner and rank r of a donor site.
//
//   joiner -> donor  JoinRequest   kControl (0, kJoinShard)        "take me in" (empty body)
//   donor -> joiner  JoinManifest  kControl (0, kJoinShard + 1)    the committed state's description
//   joiner -> donor  JoinFetch     kControl (q, kJoinShard + 2)    "send chunks [begin, end)" (q = 1, 2, ...)
//                                                                  or "done" (begin = end = 0)
//   donor -> joiner  chunk i       kGlobalState (q, i)             envelope kJoinChunk, value i
//
// The manifest, little-endian:
//   off size field
//     0    4 magic "GLJM"
//     4    2 version (1)
//     6    2 zero
//     8    8 round            the committed round the state is from
//    16    8 step             the inner step it was committed at
//    24    8 members          the round's members (the joiner among them)
//    32    8 state bytes      the serialized state (a safetensors image)
//    40    4 chunk bytes      every chunk but the last has this many
//    44    4 chunks           count, = ceil(state bytes / chunk bytes)
//    48    8 state hash       hash64 of the whole serialized state
//    56    8 weights hash     the committed global-weights hash of this rank's shard
//    64  8*n chunk hashes     hash64 of each chunk
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "outer_optimizer/membership.hpp"
#include "core/error.hpp"

namespace geoloco::outer {

// Below kMembershipShard: Transport::expire drops late membership messages, never these.
inline constexpr uint32_t kJoinShard = 0x30000000u;
inline constexpr uint32_t kJoinManifestShard = kJoinShard + 1;
inline constexpr uint32_t kJoinFetchShard = kJoinShard + 2;
inline constexpr uint32_t kSplitShard = kJoinShard + 3;  // diloco_split.cpp
inline constexpr uint32_t kResumeShard =
    kJoinShard + 4;  // --resume: the checkpoint steps a site holds (diloco_state.cpp)
inline constexpr uint8_t kJoinManifestMagic[4] = {'G', 'L', 'J', 'M'};
inline constexpr uint16_t kJoinManifestVersion = 1;
inline constexpr size_t kJoinManifestHeader = 64;
inline constexpr uint32_t kMaxJoinChunks = 1u << 20;
inline constexpr uint32_t kMinJoinChunkBytes = 4096;
inline constexpr uint32_t kMaxJoinChunkBytes = 256u << 20;

struct JoinManifest {
  uint64_t round = 0;
  int64_t step = 0;
  SiteMask members = 0;
  uint64_t state_bytes = 0;
  uint32_t chunk_bytes = 0;
  uint64_t state_hash = 0, weights_hash = 0;
  std::vector<uint64_t> chunk_hashes;

  uint32_t chunks() const { return static_cast<uint32_t>(chunk_hashes.size()); }
  // Bytes of chunk i (the last one may be short).
  uint64_t chunk_size(uint32_t i) const;
  // Same state: everything but nothing (used to tell donors that disagree).
  bool same_state(const JoinManifest& o) const;
};

class JoinError : public Error {
 public:
  using Error::Error;
};

// A manifest describing `state` cut into chunks of `chunk_bytes`.
JoinManifest describe_state(std::span<const uint8_t> state, uint32_t chunk_bytes, uint64_t round, int64_t step,
                            SiteMask members, uint64_t weights_hash);
std::vector<uint8_t> encode_manifest(const JoinManifest& m);
// Checks length, magic, version, the chunk geometry (count = ceil(bytes / chunk), chunk size
// within bounds, at most kMaxJoinChunks) and that the members name only sites of the config;
// `who` names the donor in the JoinError.
JoinManifest decode_manifest(std::span<const uint8_t> bytes, int sites, const std::string& who);

// A fetch request: chunks [begin, end), or done (begin = end = 0).
struct JoinFetch {
  uint32_t begin = 0, end = 0;
  bool done() const { return begin == 0 && end == 0; }
};
std::vector<uint8_t> encode_fetch(const JoinFetch& f);
// 8 bytes, begin <= end <= chunks, a non-empty range or done.
JoinFetch decode_fetch(std::span<const uint8_t> bytes, uint32_t chunks, const std::string& who);

}  // namespace geoloco::outer

// The outer loop's envelope around a compressed pseudo-gradient frame and its control
// messages. Every field is checked against what the receiving round expects before the
// frame inside is decoded.
//
//   off size field
//     0    4 magic "GLOS"
//     4    2 version (3; 2 is still read)
//     6    2 kind: 1 pseudo-gradient, 2 weights hash, 3 rank summary, 4 plan report, 5 plan decision,
//              6 membership, 7-10 join (request, manifest, fetch, chunk: join_wire.hpp), 11 split status,
//              12 resume steps, 13 an owner's average (outer.exchange: owner: owner_exchange.hpp)
//     8    8 round (outer step)
//    16    4 site index (config order)
//    20    4 rank
//    24    8 tokens the site processed in this round (pseudo-gradient), the hash, or (average)
//              the mask of the sites averaged
//    32    8 body bytes that follow
//    40    4 attachment bytes that follow the body (at most kMaxAttachment)
//    44    4 pseudo-gradient: the site's median inner step time in microseconds under
//              outer.pace: time (pace.hpp), else zero; every other kind (and version 2): zero
//    48    . body, then the attachment
// The attachment rides with a pseudo-gradient: what must reach exactly the sites that hold the
// contribution (outer.plan: auto's reports and decisions, plan_coordinator.hpp). A contribution
// is wholly in a round or wholly out, and so is its attachment. Version 1 (no attachment
// field, 40 bytes) is refused by name; version 2 (the step time field reserved) is read, so a
// contribution a checkpoint saved before version 3 can still be sent again.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/error.hpp"

namespace geoloco::outer {

inline constexpr uint8_t kEnvelopeMagic[4] = {'G', 'L', 'O', 'S'};
inline constexpr uint16_t kEnvelopeVersion = 3;
inline constexpr uint16_t kEnvelopeOldestVersion = 2;
inline constexpr size_t kEnvelopeBytes = 48;
inline constexpr size_t kMaxAttachment = 64 << 10;

enum class EnvelopeKind : uint16_t {
  kPseudoGradient = 1,
  kWeightsHash = 2,
  kRankSummary = 3,
  kPlanReport = 4,
  kPlanDecision = 5,
  kMembership = 6,
  kJoinRequest = 7,
  kJoinManifest = 8,
  kJoinFetch = 9,
  kJoinChunk = 10,
  kSplitStatus = 11,
  kResumeSteps = 12,
  kAverage = 13  // outer.exchange: owner: an owner's average of its slice; value: the sites averaged
};

struct Envelope {
  EnvelopeKind kind = EnvelopeKind::kPseudoGradient;
  uint64_t round = 0;
  uint32_t site = 0;
  uint32_t rank = 0;
  uint64_t value = 0;  // tokens or hash
  std::span<const uint8_t> body;
  std::span<const uint8_t> attachment;  // empty but for some pseudo-gradients
  uint32_t step_us = 0;                 // pseudo-gradients under outer.pace: time; zero otherwise
};

// A peer sent something that is not what this round expects.
class EnvelopeError : public Error {
 public:
  using Error::Error;
};

void write_envelope(const Envelope& e, std::vector<uint8_t>& out);  // header + body + attachment
// The same bytes around a body already in place: `buf` holds kEnvelopeBytes of room, then the
// body (e.g. a frame encoded at offset kEnvelopeBytes); e.body is ignored. Writes the header
// and appends e.attachment (a pseudo-gradient's frame is not copied once more).
void seal_envelope(const Envelope& e, std::vector<uint8_t>& buf);
// Parses and checks magic, version, kind, round, site, rank, the reserved field, and the body
// and attachment lengths against the bytes received, `max_body` and kMaxAttachment. `who`
// names the peer in errors.
Envelope read_envelope(std::span<const uint8_t> bytes, EnvelopeKind kind, uint64_t round, uint32_t site, uint32_t rank,
                       uint64_t max_body, const std::string& who);

}  // namespace geoloco::outer

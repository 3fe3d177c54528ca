// What a transport counts, per peer and in total (summary.json's `transport` section).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace geoloco::transport {

struct PeerStats {
  std::string site;
  int rank = 0;
  uint64_t bytes_sent = 0;      // payload bytes whose send completed
  uint64_t bytes_received = 0;  // payload bytes received and checksum-verified
  uint64_t frames_sent = 0;
  uint64_t frames_received = 0;
  uint64_t frames_rejected = 0;
  uint64_t frames_received_rndv = 0;      // of frames_received: payload pulled by rendezvous
  uint64_t frames_discarded = 0;          // frames of transfers the caller had cancelled
  uint64_t messages_sent_eager = 0;       // messages counted in the eager window (all chunks eager)
  uint64_t eager_bytes_outstanding = 0;   // of those, bytes the peer has not credited back yet
  uint64_t ops_cancelled = 0;             // operations completed with CancelledError
  std::vector<uint64_t> lane_bytes_sent;  // bytes_sent split by lane (index = lane)
  std::string failure;                    // empty while the peer is healthy
};

struct TransportStats {
  std::vector<PeerStats> peers;
  uint64_t handshakes_refused = 0;               // lanes we refused or that refused us
  uint64_t gate_refused = 0;                     // gate connections refused (garbage, bad key, ...)
  uint64_t frames_rejected_unauthenticated = 0;  // frames on endpoints not (yet) authenticated
  nlohmann::json to_json() const;
};

}  // namespace geoloco::transport

// Who is who: a rank's own identity and the peers it exchanges with.
#pragma once

#include <cstdint>
#include <string>

namespace geoloco::transport {

struct PeerInfo {
  std::string site;
  int rank = 0;
  std::string host;
  int port = 0;
  // "site/rank (host:port)" -- how every message names a peer.
  std::string name() const;
};

struct Identity {
  std::string site;
  int rank = 0;
  std::string run_id;
  uint64_t config_hash = 0;
};

// How connect() treats its peers.
//   kAll   a run's start: every peer must connect within connect_timeout_s (else connect()
//          throws); the smaller (site, rank) dials.
//   kJoin  a process joining a running job (a restarted or new site): this side dials every
//          peer, and connect() returns once every peer is connected or connect_timeout_s
//          passed; a peer it could not reach is failed (its operations fail naming why). The
//          running peers take the joiner in place of the process whose connection failed or
//          closed (Transport::generation counts it). A refusal is retried until the deadline:
//          a running peer may not have noticed yet that the old process is gone. A peer
//          with no live process (nothing answers) is given up after kJoinUnreachableS, at
//          most half of connect_timeout_s.
enum class ConnectMode { kAll, kJoin };
inline constexpr double kJoinUnreachableS = 3.0;

// Deterministic roles: the smaller (site, rank) dials, the other accepts.
inline bool dials(const Identity& self, const PeerInfo& peer) {
  return self.site < peer.site || (self.site == peer.site && self.rank < peer.rank);
}

}  // namespace geoloco::transport

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

// Deterministic roles: the smaller (site, rank) dials, the other accepts.
inline bool dials(const Identity& self, const PeerInfo& peer) {
  return self.site < peer.site || (self.site == peer.site && self.rank < peer.rank);
}

}  // namespace geoloco::transport

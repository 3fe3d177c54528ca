// SitePeers: the other sites as one rank's outer loop sees them -- site index (config order)
// to the transport's peer (rank r of that site), their names for messages, and the
// enveloped control messages (envelope.hpp) the plan protocol and the hash check exchange.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "outer_optimizer/envelope.hpp"
#include "trainer/loop/run_config.hpp"
#include "transport/transport.hpp"

namespace geoloco::outer {

inline constexpr uint64_t kMaxControlBody = 1 << 20;

class SitePeers {
 public:
  // `transport` connects this rank to rank `rank` of every other site (null for one site);
  // its peers are found by (site name, rank).
  SitePeers(const trainer::RunConfig& cfg, int site, int rank, transport::Transport* transport);

  int sites() const { return static_cast<int>(peer_.size()); }
  int site() const { return site_; }
  int rank() const { return rank_; }
  transport::Transport* transport() const { return t_; }
  // The transport's peer index of `site` (-1 for this site).
  int peer(int site) const { return peer_.at(static_cast<size_t>(site)); }
  // "self", or the peer as the transport names it: "lyon/0 (127.0.0.1:29600)".
  std::string name(int site) const;

  // A control message to `site`: an envelope of `kind` around `body`.
  transport::SendHandle send(int site, EnvelopeKind kind, uint64_t round, uint32_t shard, uint64_t value,
                             std::span<const uint8_t> body) const;
  // A posted receive of a control message from `site` (at most kMaxControlBody of body).
  transport::RecvHandle post_recv(int site, uint64_t round, uint32_t shard, uint64_t max_body = kMaxControlBody) const;
  // Waits for it and checks its envelope (kind, round, site, rank, length); the returned
  // envelope's body points into `bytes`.
  Envelope read(transport::RecvHandle& h, int site, EnvelopeKind kind, uint64_t round, std::vector<uint8_t>& bytes,
                uint64_t max_body = kMaxControlBody) const;
  // Cancels every pending operation with every site (the outer loop is going away).
  void cancel_all(const std::string& reason) const;

 private:
  int site_, rank_;
  transport::Transport* t_;
  std::vector<int> peer_;
};

}  // namespace geoloco::outer

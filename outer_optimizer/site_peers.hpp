// SitePeers: the other sites as one rank's outer loop sees them -- site index (config order)
// to the transport's peers: its partner there (the rank its control messages go to: rank r
// when every site has the same rank count) and every rank it exchanges a piece of the
// parameters with (exchange_layout.hpp), their names for messages, and the enveloped control
// messages (envelope.hpp) the plan protocol and the hash check exchange.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "outer_optimizer/envelope.hpp"
#include "outer_optimizer/exchange_layout.hpp"
#include "outer_optimizer/outer_options.hpp"
#include "transport/transport.hpp"

namespace geoloco::outer {

inline constexpr uint64_t kMaxControlBody = 1 << 20;

class SitePeers {
 public:
  // `transport` connects this rank to the ranks of every other site that connected_ranks()
  // names (null for one site); its peers are found by (site name, rank).
  SitePeers(const OuterOptions& options, transport::Transport* transport);

  // The ranks of `other` that (site, rank) is connected to: those it exchanges pieces with,
  // its partner there, and those whose partner it is (a symmetric relation).
  static std::vector<int> connected_ranks(const ExchangeLayout& layout, int site, int rank, int other);
  // The layout of a run: the model's `params` parameters over every site's ranks.
  static ExchangeLayout layout_of(const std::vector<SiteSpec>& sites, int64_t params);

  int sites() const { return static_cast<int>(peer_.size()); }
  int site() const { return site_; }
  int rank() const { return rank_; }
  const ExchangeLayout& layout() const { return layout_; }
  transport::Transport* transport() const { return t_; }
  // The transport's peer index of `site`'s partner (-1 for this site).
  int peer(int site) const { return peer_.at(static_cast<size_t>(site)); }
  // The partner's rank at `site`, and whether this rank is its partner too.
  int partner(int site) const { return layout_.partner(site_, rank_, site); }
  bool mutual(int site) const { return layout_.mutual(site_, rank_, site); }
  // The ranks of `site` whose partner this rank is (ascending; {rank()} with sites of one rank
  // count): the joiner ranks this rank serves when that site joins.
  std::vector<int> partnered_by(int site) const;
  // The transport's peer index of rank `rank` of `site` (a connected rank; Error otherwise).
  int peer_of(int site, int rank) const;
  // "self", or the peer as the transport names it: "lyon/0 (127.0.0.1:29600)".
  std::string name(int site) const;
  std::string name_of(int site, int rank) const;

  // A control message to `site` (its partner, or rank `to`): an envelope of `kind` around `body`.
  transport::SendHandle send(int site, EnvelopeKind kind, uint64_t round, uint32_t shard, uint64_t value,
                             std::span<const uint8_t> body, int to = -1) const;
  // A posted receive of a control message from `site` (its partner, or rank `from`; at most
  // kMaxControlBody of body).
  transport::RecvHandle post_recv(int site, uint64_t round, uint32_t shard, uint64_t max_body = kMaxControlBody,
                                  int from = -1) const;
  // Waits for it and checks its envelope (kind, round, site, sender's rank -- the partner's,
  // or `from` -- and length); the returned envelope's body points into `bytes`.
  Envelope read(transport::RecvHandle& h, int site, EnvelopeKind kind, uint64_t round, std::vector<uint8_t>& bytes,
                uint64_t max_body = kMaxControlBody, int from = -1) const;
  // Cancels every pending operation with every site (the outer loop is going away).
  void cancel_all(const std::string& reason) const;

 private:
  int site_, rank_;
  transport::Transport* t_;
  ExchangeLayout layout_;
  std::vector<int> peer_;                // by site: the partner's peer index
  std::vector<std::vector<int>> peers_;  // by site, by rank: peer index (-1: not connected)
};

}  // namespace geoloco::outer

// The other sites on the transport, and enveloped control messages to them (site_peers.hpp).
#include "outer_optimizer/site_peers.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace geoloco::outer {

ExchangeLayout SitePeers::layout_of(const std::vector<SiteSpec>& sites, int64_t params) {
  std::vector<int> ranks;
  for (const auto& s : sites) ranks.push_back(s.ranks);
  return ExchangeLayout(params, std::move(ranks));
}

std::vector<int> SitePeers::connected_ranks(const ExchangeLayout& layout, int site, int rank, int other) {
  std::vector<int> out = layout.linked_ranks(site, rank, other);
  out.push_back(layout.partner(site, rank, other));
  for (int q = 0; q < layout.ranks(other); ++q)
    if (layout.partner(other, q, site) == rank) out.push_back(q);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

SitePeers::SitePeers(const OuterOptions& o, transport::Transport* t)
    : site_(o.site), rank_(o.rank), t_(t), layout_(layout_of(o.sites, o.params.total)) {
  const int S = o.site_count(), site = o.site, rank = o.rank;
  peer_.assign(static_cast<size_t>(S), -1);
  peers_.resize(static_cast<size_t>(S));
  for (int s = 0; s < S; ++s) {
    if (s == site) continue;
    if (!t_) throw Error("outer loop: a multi-site run needs a transport");
    const std::string& name = o.site_name(s);
    auto& by_rank = peers_[static_cast<size_t>(s)];
    by_rank.assign(static_cast<size_t>(o.sites[static_cast<size_t>(s)].ranks), -1);
    for (int q : connected_ranks(layout_, site, rank, s)) {
      const int p = t_->peer_index(name, q);
      if (p < 0) throw Error(fmt::format("outer loop: no connection to site {} rank {}", name, q));
      by_rank[static_cast<size_t>(q)] = p;
    }
    peer_[static_cast<size_t>(s)] = by_rank.at(static_cast<size_t>(partner(s)));
  }
}

std::vector<int> SitePeers::partnered_by(int s) const {
  std::vector<int> out;
  for (int q = 0; q < layout_.ranks(s); ++q)
    if (layout_.partner(s, q, site_) == rank_) out.push_back(q);
  return out;
}

int SitePeers::peer_of(int s, int rank) const {
  const auto& by_rank = peers_.at(static_cast<size_t>(s));
  const int p = rank >= 0 && rank < static_cast<int>(by_rank.size()) ? by_rank[static_cast<size_t>(rank)] : -1;
  if (p < 0) throw Error(fmt::format("outer loop: this rank has no connection to site {} rank {}", s, rank));
  return p;
}

std::string SitePeers::name(int s) const {
  const int p = peer(s);
  return p < 0 ? "self" : t_->peers()[static_cast<size_t>(p)].name();
}

std::string SitePeers::name_of(int s, int rank) const {
  if (s == site_) return "self";
  return t_->peers()[static_cast<size_t>(peer_of(s, rank))].name();
}

transport::SendHandle SitePeers::send(int s, EnvelopeKind kind, uint64_t round, uint32_t shard, uint64_t value,
                                      std::span<const uint8_t> body, int to) const {
  std::vector<uint8_t> buf;
  write_envelope({kind, round, static_cast<uint32_t>(site_), static_cast<uint32_t>(rank_), value, body, {}}, buf);
  return t_->send(to < 0 ? peer(s) : peer_of(s, to), transport::FrameKind::kControl, round, shard,
                  transport::make_payload(std::move(buf)));
}

transport::RecvHandle SitePeers::post_recv(int s, uint64_t round, uint32_t shard, uint64_t max_body, int from) const {
  return t_->recv(from < 0 ? peer(s) : peer_of(s, from), transport::FrameKind::kControl, round, shard,
                  static_cast<size_t>(kEnvelopeBytes + max_body));
}

Envelope SitePeers::read(transport::RecvHandle& h, int s, EnvelopeKind kind, uint64_t round,
                         std::vector<uint8_t>& bytes, uint64_t max_body, int from) const {
  h.wait();
  bytes = h.take();
  bytes.resize(h.bytes());
  const int sender = from < 0 ? partner(s) : from;
  return read_envelope(bytes, kind, round, static_cast<uint32_t>(s), static_cast<uint32_t>(sender), max_body,
                       name_of(s, sender));
}

void SitePeers::cancel_all(const std::string& reason) const {
  if (!t_) return;
  for (const auto& by_rank : peers_)
    for (int p : by_rank)
      if (p >= 0) t_->cancel(p, reason);
}

}  // namespace geoloco::outer

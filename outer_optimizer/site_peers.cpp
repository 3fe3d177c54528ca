// The other sites on the transport, and enveloped control messages to them (site_peers.hpp).
#include "outer_optimizer/site_peers.hpp"

#include <fmt/format.h>

namespace geoloco::outer {

SitePeers::SitePeers(const trainer::RunConfig& cfg, int site, int rank, transport::Transport* t)
    : site_(site), rank_(rank), t_(t) {
  const int S = static_cast<int>(cfg.sites.size());
  peer_.assign(static_cast<size_t>(S), -1);
  for (int s = 0; s < S; ++s) {
    if (s == site) continue;
    if (!t_) throw Error("outer loop: a multi-site run needs a transport");
    const std::string& name = cfg.sites[static_cast<size_t>(s)].name;
    const int p = t_->peer_index(name, rank);
    if (p < 0) throw Error(fmt::format("outer loop: no connection to site {} rank {}", name, rank));
    peer_[static_cast<size_t>(s)] = p;
  }
}

std::string SitePeers::name(int s) const {
  const int p = peer(s);
  return p < 0 ? "self" : t_->peers()[static_cast<size_t>(p)].name();
}

transport::SendHandle SitePeers::send(int s, EnvelopeKind kind, uint64_t round, uint32_t shard, uint64_t value,
                                      std::span<const uint8_t> body) const {
  std::vector<uint8_t> buf;
  write_envelope({kind, round, static_cast<uint32_t>(site_), static_cast<uint32_t>(rank_), value, body, {}}, buf);
  return t_->send(peer(s), transport::FrameKind::kControl, round, shard, transport::make_payload(std::move(buf)));
}

transport::RecvHandle SitePeers::post_recv(int s, uint64_t round, uint32_t shard, uint64_t max_body) const {
  return t_->recv(peer(s), transport::FrameKind::kControl, round, shard,
                  static_cast<size_t>(kEnvelopeBytes + max_body));
}

Envelope SitePeers::read(transport::RecvHandle& h, int s, EnvelopeKind kind, uint64_t round,
                         std::vector<uint8_t>& bytes, uint64_t max_body) const {
  h.wait();
  bytes = h.take();
  bytes.resize(h.bytes());
  return read_envelope(bytes, kind, round, static_cast<uint32_t>(s), static_cast<uint32_t>(rank_), max_body, name(s));
}

void SitePeers::cancel_all(const std::string& reason) const {
  if (!t_) return;
  for (int p : peer_)
    if (p >= 0) t_->cancel(p, reason);
}

}  // namespace geoloco::outer

// The cross-site weights-hash check, posted and verified (hash_check.hpp).
#include "outer_optimizer/hash_check.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "core/hash.hpp"
#include "transport/transport_error.hpp"

namespace geoloco::outer {

HashCheck post_hash_check(const SitePeers& peers, const std::vector<PieceHash>& hashes, uint64_t round,
                          uint64_t members) {
  HashCheck c;
  c.round = round;
  const auto& pieces = peers.layout().pieces();
  for (int s = 0; s < peers.sites(); ++s) {
    if (s == peers.site() || !((members >> s) & 1)) continue;
    for (const PieceHash& ph : hashes) {
      const int q = pieces.at(ph.piece).owner.at(static_cast<size_t>(s));
      c.replies.push_back({s, ph.piece, q, ph.hash, peers.post_recv(s, round, ph.piece, 0, q)});
      c.sends.push_back(peers.send(s, EnvelopeKind::kWeightsHash, round, ph.piece, ph.hash, {}, q));
    }
  }
  return c;
}

uint64_t verify_hash_check(const SitePeers& peers, const OuterOptions& cfg, HashCheck& c, bool tolerate_lost,
                           std::optional<std::chrono::steady_clock::time_point> until) {
  uint64_t lost = 0;
  const bool limited = tolerate_lost && until.has_value();
  // Waits for `op` until the limit; false (and the op cancelled) when it is not done by then.
  auto in_time = [&](const auto& op) {
    if (!limited) return true;
    const auto left = *until - std::chrono::steady_clock::now();
    try {
      if (op.wait_for(std::chrono::duration<double>(std::max(left, std::chrono::steady_clock::duration::zero()))))
        return true;
    } catch (const transport::TransportError&) {
      return true;  // done, failed: the wait below reports it
    }
    op.cancel();
    return false;
  };
  for (auto& op : c.sends) {
    try {
      if (in_time(op)) op.wait();
    } catch (const transport::TransportError&) {
      if (!tolerate_lost) throw;  // the reply from that site fails too, naming it
    }
  }
  for (auto& reply : c.replies) {
    const int s = reply.site;
    auto& op = reply.recv;
    if ((lost >> s) & 1) {
      op.cancel();
      continue;
    }
    std::vector<uint8_t> bytes;
    Envelope e;
    if (!in_time(op)) {
      spdlog::warn(
          "outer round {}: the hash check from site {} did not arrive within the round's deadline; it is "
          "late, not checked this round",
          c.round, cfg.site_name(s));
      lost |= uint64_t{1} << s;
      continue;
    }
    try {
      e = peers.read(op, s, EnvelopeKind::kWeightsHash, c.round, bytes, 0, reply.rank);
    } catch (const transport::TransportError& err) {
      if (!tolerate_lost) throw;
      spdlog::warn("outer round {}: the hash check from site {} did not arrive ({}); it left after the round", c.round,
                   cfg.site_name(s), err.what());
      lost |= uint64_t{1} << s;
      continue;
    }
    if (e.value == reply.hash) continue;
    const std::string& here = cfg.site_name(peers.site());
    const std::string& there = cfg.site_name(s);
    const Piece& p = peers.layout().pieces().at(reply.piece);
    const std::string what = peers.layout().uniform()
                                 ? fmt::format("shard {}", reply.piece)
                                 : fmt::format("piece {} (elements {}..{})", reply.piece, p.begin, p.end);
    // Round 0 is the start: nothing has trained yet, so the inputs of the init differ.
    if (c.round == 0)
      throw Error(
          fmt::format("initial weights differ between sites: {} hash {} here (site {}) but {} at site {} ({}); every "
                      "site must start from the same weights: same run.seed and, with train.init_from, the same file "
                      "contents ({} here)",
                      what, hex64(reply.hash), here, hex64(e.value), there, peers.name_of(s, reply.rank),
                      cfg.init_from.empty() ? std::string("none") : cfg.init_from));
    throw Error(
        fmt::format("outer round {}: global weights diverged: {} hash {} here (site {}) but {} at site "
                    "{} ({}); stopping",
                    c.round, what, hex64(reply.hash), here, hex64(e.value), there, peers.name_of(s, reply.rank)));
  }
  return lost;
}

}  // namespace geoloco::outer

// The cross-site weights-hash check, posted and verified (hash_check.hpp).
#include "outer_optimizer/hash_check.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "trainer/core/hash.hpp"
#include "transport/transport_error.hpp"

namespace geoloco::outer {

HashCheck post_hash_check(const SitePeers& peers, uint64_t h, uint64_t round, uint64_t members) {
  HashCheck c;
  c.round = round;
  c.hash = h;
  const auto shard = static_cast<uint32_t>(peers.rank());
  for (int s = 0; s < peers.sites(); ++s) {
    if (s == peers.site() || !((members >> s) & 1)) continue;
    c.replies.emplace_back(s, peers.post_recv(s, round, shard, 0));
    c.sends.push_back(peers.send(s, EnvelopeKind::kWeightsHash, round, shard, h, {}));
  }
  return c;
}

uint64_t verify_hash_check(const SitePeers& peers, const trainer::RunConfig& cfg, HashCheck& c, bool tolerate_lost,
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
  for (auto& [s, op] : c.replies) {
    std::vector<uint8_t> bytes;
    Envelope e;
    if (!in_time(op)) {
      spdlog::warn(
          "outer round {}: the hash check from site {} did not arrive within the round's deadline; it is "
          "late, not checked this round",
          c.round, cfg.sites[static_cast<size_t>(s)].name);
      lost |= uint64_t{1} << s;
      continue;
    }
    try {
      e = peers.read(op, s, EnvelopeKind::kWeightsHash, c.round, bytes, 0);
    } catch (const transport::TransportError& err) {
      if (!tolerate_lost) throw;
      spdlog::warn("outer round {}: the hash check from site {} did not arrive ({}); it left after the round", c.round,
                   cfg.sites[static_cast<size_t>(s)].name, err.what());
      lost |= uint64_t{1} << s;
      continue;
    }
    if (e.value == c.hash) continue;
    const std::string& here = cfg.sites[static_cast<size_t>(peers.site())].name;
    const std::string& there = cfg.sites[static_cast<size_t>(s)].name;
    // Round 0 is the start: nothing has trained yet, so the inputs of the init differ.
    if (c.round == 0)
      throw Error(fmt::format(
          "initial weights differ between sites: shard {} hash {} here (site {}) but {} at site {} ({}); every "
          "site must start from the same weights: same run.seed and, with train.init_from, the same file "
          "contents ({} here)",
          peers.rank(), hex64(c.hash), here, hex64(e.value), there, peers.name(s),
          cfg.train.init_from.empty() ? std::string("none") : cfg.train.init_from));
    throw Error(
        fmt::format("outer round {}: global weights diverged: shard {} hash {} here (site {}) but {} at site "
                    "{} ({}); stopping",
                    c.round, peers.rank(), hex64(c.hash), here, hex64(e.value), there, peers.name(s)));
  }
  return lost;
}

}  // namespace geoloco::outer

// The cross-site weights-hash check (outer.check_hash): after a round's outer step every rank
// sends the hash of each piece of its shard of the new global weights (exchange_layout.hpp;
// with sites of one rank count, the shard) to that piece's owner at every other site,
// and verifies theirs at the fragment's next round (or a checkpoint, a re-plan, the run's end),
// so it costs no round trip on the sync path. Round 0 is the start: every site must begin
// from the same weights. A mismatch stops the run naming the round, the shard and both sites.
// A round's check covers its members; a member whose reply cannot arrive (it died or left
// since) is no divergence: its loss shows in the next round's membership. Nor is a member
// that is alive but stuck: with a time limit (the next round's deadline) its reply is waited
// for until then, never longer, so a stopped site cannot hold the others past the deadline.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "outer_optimizer/site_peers.hpp"
#include "outer_optimizer/outer_options.hpp"

namespace geoloco::outer {

// The hash of one piece of this rank's shard (exchange_layout.hpp) or of a fragment's part of it.
struct PieceHash {
  uint32_t piece = 0;
  uint64_t hash = 0;
};

// A posted check: the hashes sent for `round` and the replies still arriving.
struct HashCheck {
  struct Reply {
    int site = 0;
    uint32_t piece = 0;
    int rank = 0;       // the piece's owner at that site
    uint64_t hash = 0;  // this rank's hash of the piece
    transport::RecvHandle recv;
  };
  uint64_t round = 0;
  std::vector<Reply> replies;
  std::vector<transport::SendHandle> sends;
};

// To every site of `members` but this one (all sites: ~0): each piece's hash to its owner there.
HashCheck post_hash_check(const SitePeers& peers, const std::vector<PieceHash>& hashes, uint64_t round,
                          uint64_t members = ~uint64_t{0});
// Waits for every reply and compares; throws Error naming the divergence. `tolerate_lost`:
// a reply that fails in the transport (peer died, cancelled) is logged and skipped.
// `until` (with tolerate_lost): a reply or send not done by then is cancelled and counted
// as lost, like one that failed. Returns the sites whose reply did not come.
uint64_t verify_hash_check(const SitePeers& peers, const OuterOptions& options, HashCheck& check,
                           bool tolerate_lost = false,
                           std::optional<std::chrono::steady_clock::time_point> until = std::nullopt);

}  // namespace geoloco::outer

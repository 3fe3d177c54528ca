// Runs one round's membership consensus (membership.hpp) over the transport, between this
// rank and the same rank of every other site: the messages as enveloped control messages
// (kind kMembership, a 64-byte GLMB body), the clock, and the wait. Used by the site leaders
// (rank 0); docs/elastic.md says what the decision means.
//
// Each message to a site carries a per-(round, sender) sequence number in the frame's shard
// field (kMembershipShard + n), so the receiver always has the next one posted and messages
// are matched in the order they were sent. A site whose connection fails (dead, cancelled,
// timed out) is simply no longer heard from; the consensus decides without it when the
// quorum allows.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "outer_optimizer/membership.hpp"
#include "outer_optimizer/site_peers.hpp"

namespace geoloco::outer {

inline constexpr uint32_t kMembershipShard = 0x40000000u;  // + sequence number, < 2^24 per round

// No decision within the wait: fewer than `quorum` sites could agree.
class QuorumLost : public Error {
 public:
  QuorumLost(const std::string& what, SiteMask heard) : Error(what), heard_(heard) {}
  SiteMask heard() const { return heard_; }  // sites this one still heard from

 private:
  SiteMask heard_;
};

struct MembershipOutcome {
  SiteMask members = 0;
  bool can_apply = false;  // this site holds every member's contribution
  SiteMask foreign = 0;    // the other side of a partition decided this round as these sites (ConsensusConfig::in_run)
  int ballots = 0;         // ballots this site started
  double seconds = 0;      // from the call to the decision
  double first_ballot_s = -1;  // from the call to the first ballot this site started (-1: none)
  uint64_t messages_sent = 0, messages_received = 0;
};

// Decides round `round`'s membership given this site's final holdings (ready at once).
// Returns when this site knows the decision; throws QuorumLost after `wait_s` without one,
// MembershipError or EnvelopeError for a malformed message (naming the peer). `cc.sites`
// and `cc.self` must match `peers`.
// `abort`, when set, ends the wait early with an Error (the outer loop is stopping).
// `unheard_grace_s`: the wait counts from when the last site whose link is alive took part
// (a site that has sent nothing this round may still be waiting out its exchange deadline),
// starting at most that late.
MembershipOutcome agree_membership(const SitePeers& peers, const ConsensusConfig& cc, uint64_t round, SiteMask holds,
                                   double wait_s, const std::atomic<bool>* abort = nullptr, double unheard_grace_s = 0);

}  // namespace geoloco::outer

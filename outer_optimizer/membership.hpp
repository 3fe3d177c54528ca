// Membership of one outer round (docs/elastic.md): which sites' contributions are in it,
// agreed among the site leaders (rank 0 of every site) by single-decree Paxos, one instance
// per round. A pure state machine: no threads, no clock, no transport. The caller feeds it
// messages and the time, and sends what take_outbox() returns; tests drive several of them
// over a simulated network (tests/outer_optimizer/test_membership.cpp).
//
// Every site of the config is an acceptor. A site takes part once it is ready (ready():
// its holdings are complete, or its round deadline passed); before that it queues prepares
// (so a proposal never reflects a site's view before its own deadline) but may accept.
//
//  * Value: a SiteMask, the round's members. A free proposer proposes the intersection of
//    the holdings (sites whose whole contribution the site holds) of the sites that
//    promised, leaving out promisers the others do not hold (choose_members), so every
//    promiser left holds every member; a member that does not hold them all must leave and
//    rejoin from peers (can_apply()).
//  * Quorum: a decision needs promises and acceptances from `quorum` sites and a
//    membership of at least `quorum` sites (outer.min_sites, default a strict majority).
//    When quorum is below a majority, a ballot first waits `degrade_s` for a majority and
//    only then settles for `quorum`: in a connected run two proposers never decide
//    differently, but two sides of a partition can (the heal rule of docs/elastic.md).
//  * Liveness: the site with the lowest index among those it holds proposes first; the
//    others start `retry_s` later, each offset by its index; a ballot that stalls for
//    `retry_s` is retried with a higher one. A decided site answers prepares and accepts
//    with the decision, so a site that missed the decide learns it from anyone.
//
// Ballots are counter * 64 + site: unique per site and totally ordered.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/error.hpp"

namespace geoloco::outer {

using SiteMask = uint64_t;  // bit s: site s in config order
inline constexpr int kMaxSites = 64;

int mask_count(SiteMask m);
SiteMask all_sites(int sites);
// "{0,2,3}" (site indices), for logs and errors.
std::string mask_string(SiteMask m);

// kHolds: a site's final holdings, sent to every site when it becomes ready (the fast path).
enum class MemberMsgType : uint8_t {
  kPrepare = 1,
  kPromise = 2,
  kAccept = 3,
  kAccepted = 4,
  kDecide = 5,
  kNack = 6,
  kHolds = 7
};

struct MemberMsg {
  MemberMsgType type = MemberMsgType::kPrepare;
  uint32_t from = 0, to = 0;  // site indices
  uint64_t round = 0;
  uint64_t ballot = 0;           // the ballot the message is about (Decide: the deciding one)
  uint64_t promised = 0;         // Nack: the ballot the acceptor has promised instead
  uint64_t accepted_ballot = 0;  // Promise: the acceptor's accepted ballot, 0 if none
  SiteMask value = 0;            // Promise: its accepted value; Accept/Accepted/Decide: the membership
  SiteMask holds = 0;            // Promise: the acceptor's holdings
};

// The wire form, a fixed 64-byte little-endian record:
//   off size field
//     0    4 magic "GLMB"
//     4    2 version (2: adds kHolds)
//     6    1 type (MemberMsgType)
//     7    1 zero
//     8    4 from site          12 4 to site
//    16    8 round              24 8 ballot
//    32    8 promised           40 8 accepted ballot
//    48    8 value              56 8 holds
inline constexpr size_t kMemberMsgBytes = 64;
inline constexpr uint16_t kMemberMsgVersion = 2;

class MembershipError : public Error {
 public:
  using Error::Error;
};

std::vector<uint8_t> encode_member_msg(const MemberMsg& m);
// Checks length, magic, version, type, the site indices (< sites, from != to, from ==
// expected_from) and that both masks name only sites of the config; `who` names the peer in
// the MembershipError.
MemberMsg decode_member_msg(std::span<const uint8_t> bytes, int sites, uint32_t expected_from, const std::string& who);

struct ConsensusConfig {
  int sites = 0;           // in the config, 1..64
  int self = 0;            // this site's index
  int quorum = 0;          // outer.min_sites: 1..sites
  double retry_s = 1.0;    // a ballot's patience before the next one
  double degrade_s = 0.5;  // quorum below a majority: how long a ballot waits for a majority
  // The fast path: the sites still in the run (0: none). When every one of them reports, in
  // its kHolds, that it holds exactly `expected`, and so does this site, the round is decided
  // as `expected` after one message delay, without a ballot. Safe: every final holding is
  // then `expected`, so any ballot's value is `expected` too.
  SiteMask expected = 0;
  // The sites this site counts in the run (0: every site). With quorum below a majority a
  // site out of it was evicted by this side and may be the other side of a partition, which
  // decides its own rounds (docs/elastic.md): its messages take no part in this side's
  // consensus (a decision of its is recorded, foreign(), not adopted). Otherwise a side that
  // lags after the cut heals would learn, or be asked to accept, the other side's membership
  // for a round both decide, and its sites would stop as "left out" before the heal rule
  // (which may keep this side) settles the split.
  SiteMask in_run = 0;
};

int majority(int sites);  // sites / 2 + 1

// A free proposer's membership from the promisers' holdings (`holds` by site): what every
// promiser holds, after leaving out, one at a time, promisers that some other promiser does
// not hold (the least held first): every promiser left holds every member, and one site that
// holds little (e.g. one of its ranks lost every contribution) cannot empty the round.
// `holders`: the promisers that hold every member.
struct MemberChoice {
  SiteMask members = 0, holders = 0;
};
MemberChoice choose_members(SiteMask promisers, std::span<const SiteMask> holds);

class RoundConsensus {
 public:
  RoundConsensus(const ConsensusConfig& cfg, uint64_t round);

  uint64_t round() const { return round_; }
  // Sites whose whole contribution this site holds (itself included); only grows.
  void add_holds(SiteMask holds);
  SiteMask holds() const { return holds_; }
  // This site stops waiting for contributions: answers queued prepares, may propose.
  void ready(double now);
  bool is_ready() const { return ready_; }

  // A message addressed to this site, for this round (others are the caller's mistake).
  void receive(const MemberMsg& m, double now);
  // Timers: starts and retries ballots, settles for a degraded quorum.
  void tick(double now);
  // Messages to send (to != self), in the order they were produced.
  std::vector<MemberMsg> take_outbox();

  const std::optional<SiteMask>& decided() const { return decided_; }
  // The decision conflicts with another site's (only possible with quorum below majority,
  // across a partition): the other value, for the caller's heal rule.
  const std::optional<SiteMask>& conflict() const { return conflict_; }
  // A decision of a site out of the run (ConsensusConfig::in_run), not adopted.
  const std::optional<SiteMask>& foreign() const { return foreign_; }
  // This site can compute the round's average: it holds every member's contribution.
  bool can_apply() const { return decided_ && (*decided_ & ~holds_) == 0; }
  // Ballots this site started (for metrics and tests).
  int ballots_started() const { return ballots_; }

 private:
  void handle(const MemberMsg& m);
  void on_prepare(const MemberMsg& m);
  void on_accept(const MemberMsg& m);
  void on_promise(const MemberMsg& m);
  void on_accepted(const MemberMsg& m);
  void on_nack(const MemberMsg& m);
  void on_decide(const MemberMsg& m);
  void note_foreign(uint64_t ballot);
  bool outside(uint32_t site) const;  // in_run says this site's messages take no part
  void start_ballot();
  void propose();
  void decide(SiteMask value, uint64_t ballot);
  int needed() const;
  void send(MemberMsg m);
  void broadcast(MemberMsg m, bool include_self);
  void resend(double now, SiteMask answered, MemberMsg m);
  // Delivers what this site sent itself (the acceptor of its own ballots).
  void drain_self();
  int position() const;     // sites held with a lower index than self
  double offset() const;    // this site's share of patience(), spreading retries apart
  double patience() const;  // retry_s, doubled per ballot started (at most 8x)

  ConsensusConfig cfg_;
  uint64_t round_;
  SiteMask holds_;
  bool ready_ = false;
  double now_ = 0;
  std::vector<MemberMsg> outbox_, self_inbox_;
  std::vector<MemberMsg> queued_prepares_;  // received before ready()
  // Fast path: sites whose kHolds arrived, and whether every one said `expected`.
  SiteMask fast_from_ = 0;
  bool fast_ok_ = true;
  void try_fast();

  // Acceptor.
  uint64_t promised_ = 0, accepted_ballot_ = 0;
  SiteMask accepted_value_ = 0;

  // Proposer.
  enum class Phase { kIdle, kPreparing, kAccepting } phase_ = Phase::kIdle;
  uint64_t ballot_ = 0;
  uint64_t highest_seen_ = 0;  // highest ballot seen anywhere
  double phase_start_ = 0, next_attempt_ = -1, collect_until_ = -1;
  double last_send_ = 0;
  double last_foreign_ = -1;  // when another site's ballot was last seen
  SiteMask promised_by_ = 0, accepted_by_ = 0;
  std::vector<SiteMask> promise_holds_;  // by site: a promiser's holdings
  uint64_t best_accepted_ballot_ = 0;
  SiteMask best_accepted_value_ = 0;
  SiteMask proposal_ = 0;
  int ballots_ = 0;

  std::optional<SiteMask> decided_, conflict_, foreign_;
  uint64_t decided_ballot_ = 0;
};

}  // namespace geoloco::outer

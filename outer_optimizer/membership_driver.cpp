// One round's membership consensus over the transport (membership_driver.hpp).
#include "outer_optimizer/membership_driver.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <thread>
#include <vector>

#include "transport/transport_error.hpp"

namespace geoloco::outer {

namespace {

constexpr uint32_t kMaxSequence = 1u << 24;

struct PeerLink {
  int site = -1;
  bool alive = true;
  bool heard = false;  // a message of this round came from it
  uint32_t next_in = 0, next_out = 0;
  std::optional<transport::RecvHandle> recv;
};

}  // namespace

MembershipOutcome agree_membership(const SitePeers& peers, const ConsensusConfig& cc, uint64_t round, SiteMask holds,
                                   double wait_s, const std::atomic<bool>* abort, double unheard_grace_s) {
  GEOLOCO_CHECK(cc.sites == peers.sites() && cc.self == peers.site(),
                "consensus for site {} of {}, peers of site {} of {}", cc.self, cc.sites, peers.site(), peers.sites());
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  auto now = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };

  RoundConsensus rc(cc, round);
  rc.add_holds(holds);
  MembershipOutcome out;
  std::vector<PeerLink> links;
  for (int s = 0; s < cc.sites; ++s) {
    if (s == cc.self) continue;
    PeerLink l;
    l.site = s;
    l.recv = peers.post_recv(s, round, kMembershipShard, kMemberMsgBytes);
    links.push_back(std::move(l));
  }
  auto link_of = [&](uint32_t site) -> PeerLink& {
    for (auto& l : links)
      if (l.site == static_cast<int>(site)) return l;
    GEOLOCO_CHECK(false, "no link to site {}", site);
    __builtin_unreachable();
  };
  std::vector<transport::SendHandle> sends;
  double last_joined = 0;  // when the last site heard from this round was first heard
  auto flush = [&] {
    if (out.first_ballot_s < 0 && rc.ballots_started() > 0) out.first_ballot_s = now();
    for (const auto& m : rc.take_outbox()) {
      PeerLink& l = link_of(m.to);
      if (!l.alive) continue;
      if (l.next_out >= kMaxSequence)
        throw MembershipError(fmt::format("round {}: too many membership messages", round));
      const auto body = encode_member_msg(m);
      try {
        sends.push_back(peers.send(l.site, EnvelopeKind::kMembership, round, kMembershipShard + l.next_out++, 0, body));
        ++out.messages_sent;
      } catch (const transport::TransportError&) {
        l.alive = false;  // the peer is gone: the consensus goes on without it
      }
    }
  };
  // Every pending receive is cancelled on the way out (decided or not), so no operation of
  // this round outlives the call.
  struct CancelOnExit {
    std::vector<PeerLink>& links;
    ~CancelOnExit() {
      for (auto& l : links)
        if (l.recv) l.recv->cancel();
    }
  } cancel_on_exit{links};

  rc.ready(now());
  flush();
  while (!rc.decided()) {
    bool progressed = false;
    for (auto& l : links) {
      if (!l.alive || !l.recv || !l.recv->ready()) continue;
      std::vector<uint8_t> bytes;
      Envelope e;
      try {
        e = peers.read(*l.recv, l.site, EnvelopeKind::kMembership, round, bytes, kMemberMsgBytes);
      } catch (const transport::TransportError&) {  // an EnvelopeError (garbage) goes up
        l.alive = false;                            // died, cancelled or timed out: no longer heard from
        l.recv.reset();
        continue;
      }
      const MemberMsg m = decode_member_msg(e.body, cc.sites, static_cast<uint32_t>(l.site), peers.name(l.site));
      if (m.to != static_cast<uint32_t>(cc.self) || m.round != round)
        throw MembershipError(
            fmt::format("membership message from {}: addressed to site {} round {}, this is site {} round {}",
                        peers.name(l.site), m.to, m.round, cc.self, round));
      ++out.messages_received;
      if (!l.heard) last_joined = std::max(last_joined, now());
      l.heard = true;
      if (++l.next_in >= kMaxSequence)
        throw MembershipError(fmt::format("round {}: too many membership messages from {}", round, peers.name(l.site)));
      l.recv = peers.post_recv(l.site, round, kMembershipShard + l.next_in, kMemberMsgBytes);
      rc.receive(m, now());
      flush();
      progressed = true;
    }
    rc.tick(now());
    flush();
    if (rc.decided()) break;
    if (abort && abort->load())
      throw Error(fmt::format("outer round {}: membership abandoned: the outer loop is stopping", round));
    // The wait counts from when the last live site took part (a site that has said nothing
    // this round may still be waiting out its exchange), at most `unheard_grace_s` late.
    bool unheard = false;
    for (const auto& l : links) unheard = unheard || (l.alive && !l.heard);
    const double start = std::min(unheard ? now() : last_joined, unheard_grace_s);
    if (now() >= start + wait_s) {
      SiteMask heard = SiteMask{1} << cc.self;
      for (const auto& l : links)
        if (l.alive) heard |= SiteMask{1} << l.site;
      throw QuorumLost(fmt::format("outer round {}: no membership agreed within {:.1f} s: {} of {} sites reachable {} "
                                   "(min_sites {})",
                                   round, wait_s, mask_count(heard), cc.sites, mask_string(heard), cc.quorum),
                       heard);
    }
    if (!progressed) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  // Sends still in flight keep their own buffers (transport/op.hpp); a decide to a slow peer
  // completes or fails on its own after we return. The round's later messages (answers to
  // ballots that no longer matter, holdings after the decision) are not wanted any more:
  // without this they would pile up in the transport, round after round.
  peers.transport()->expire(transport::FrameKind::kControl, round + 1, kMembershipShard);
  out.members = *rc.decided();
  out.can_apply = rc.can_apply();
  if (rc.foreign()) out.foreign = *rc.foreign();
  out.ballots = rc.ballots_started();
  out.seconds = now();
  return out;
}

}  // namespace geoloco::outer

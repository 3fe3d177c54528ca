// RoundMembership: who is in each outer round, as this rank's site decides it with the other
// sites (docs/elastic.md). Per round: the sites this rank holds a whole contribution from,
// ANDed over the site's ranks (one all-gather), the site leader's consensus with the other
// leaders (membership_driver.hpp), and the decision shared back with the site's ranks (a
// second all-gather), so every rank of every member site averages the same members. Also
// the round deadline (how long a round waits for a site) and the books: the sites still in
// the run, every eviction with its round and reason.
//
// A site left out of a round (dead, stopped, too slow, or one of its ranks lost a
// contribution) is evicted: the others never wait for it again. The evicted site itself
// learns it from the decision and stops (SiteLeftOut); it never sends a pseudo-gradient
// computed from weights it did not receive.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "outer_optimizer/membership.hpp"
#include "outer_optimizer/outer_options.hpp"
#include "outer_optimizer/site.hpp"
#include "outer_optimizer/site_peers.hpp"

namespace geoloco::outer {

// This site is not a member of a round the others committed: it must stop (and rejoin).
class SiteLeftOut : public Error {
 public:
  using Error::Error;
};

struct Eviction {
  uint64_t round = 0;
  int64_t step = 0;
  int site = 0;
  std::string why;
};

// A site taken (back) into the run: a member of `round`, which it did not contribute to; it
// fetches the state committed by that round from the members and contributes from the next.
struct Admission {
  uint64_t round = 0;
  int64_t step = 0;
  int site = 0;
};

class RoundMembership {
 public:
  RoundMembership(const OuterOptions& options, const SitePeers& peers);

  // Sites this round exchanges with (every site at the start; members of the last round
  // after; a test's leave_out hook takes its site out from its round on). A site taken in
  // is active from the round activate() names: rounds launched before it got the state
  // (still in flight when it was admitted, with overlap) neither wait for it nor evict it.
  SiteMask active(uint64_t round) const;
  // How long this round waits for a site's contribution (outer.deadline_s, or auto: at
  // least deadline_floor_s and 4x the 90th percentile of the last 16 rounds' waits).
  double deadline_s() const;
  void record_wait(double seconds);

  // The members of a round, decided with the other sites in three parts, so that the
  // consensus can run on another thread while the inner loop trains (overlap):
  //  * vote_site (a collective, every rank at the same point): `holds`, the sites this rank
  //    holds a whole contribution from (itself included), ANDed over the site's ranks;
  //  * agree (the leader only, any thread): the consensus with the other leaders, its outcome
  //    as a verdict; touches no mutable state of this object;
  //  * share (a collective): every rank learns the leader's verdict and gets the members, or
  //    throws, on every rank of the site, QuorumLost (fewer than min_sites could agree within
  //    quorum_wait_s) or SiteLeftOut (the others committed the round without this site);
  //    `missing`, by site, why a site is not held (for the errors and the eviction books).
  // `joiners`: sites out of the run whose request to join this rank holds; they are voted
  // for like held contributions (a joiner is admitted once every member site holds its
  // request, on every rank).
  SiteMask vote_site(uint64_t round, SiteMask holds, SiteMask joiners, Site& site);
  // `in_run`: members() when the vote was taken (ConsensusConfig::in_run).
  std::vector<std::byte> agree(uint64_t round, SiteMask site_holds, SiteMask expected, SiteMask in_run) const;
  SiteMask share(uint64_t round, int64_t step, SiteMask site_holds, std::vector<std::byte> verdict,
                 const std::vector<std::string>& missing, Site& site);

  int quorum() const { return cc_.quorum; }
  // The sites in the run: the latest round's members and the sites admitted since, active or not.
  SiteMask members() const { return members_; }
  // Sites admitted (share() took them in) not yet active: they are being served the state.
  SiteMask pending() const;
  // The sites admitted and not yet active take part in the rounds numbered `first_round` on.
  void activate(SiteMask joiners, uint64_t first_round);
  // A joiner: the members of the run whose state it fetched, every one active from now on.
  void set_members(SiteMask m);
  const std::vector<Eviction>& evictions() const { return evictions_; }
  const std::vector<Admission>& admissions() const { return admissions_; }
  // Ends any agree() still waiting (the outer loop is going away).
  void stop() { stopping_.store(true); }

 private:
  SiteMask in_round(uint64_t round) const;  // active() without the test hook

  const OuterOptions& opt_;
  const SitePeers& peers_;
  const OuterHooks& hooks_;
  ConsensusConfig cc_;
  SiteMask members_;
  // By site: the first round it takes part in (0 for the sites that started the run;
  // kNotYet for a site admitted and not yet activated).
  static constexpr uint64_t kNotYet = ~uint64_t{0};
  std::vector<uint64_t> first_round_;
  std::deque<double> waits_;
  std::vector<Eviction> evictions_;
  std::vector<Admission> admissions_;
  std::atomic<bool> stopping_{false};
};

}  // namespace geoloco::outer

// Who is in each outer round: the site's vote, the leaders' consensus, the deadline, the books
// (round_membership.hpp).
#include "outer_optimizer/round_membership.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "outer_optimizer/membership_driver.hpp"

namespace geoloco::outer {

namespace {

constexpr size_t kRecentWaits = 16;

// The leader's outcome as the site's ranks receive it.
enum class Verdict : uint8_t { kDecided = 0, kQuorumLost = 1, kError = 2 };

std::vector<std::byte> encode_verdict(Verdict v, SiteMask members, bool can_apply, const std::string& msg) {
  std::vector<std::byte> b(10 + msg.size());
  b[0] = static_cast<std::byte>(v);
  std::memcpy(b.data() + 1, &members, 8);
  b[9] = static_cast<std::byte>(can_apply ? 1 : 0);
  std::memcpy(b.data() + 10, msg.data(), msg.size());
  return b;
}

}  // namespace

RoundMembership::RoundMembership(const OuterOptions& o, const SitePeers& peers)
    : opt_(o), peers_(peers), hooks_(o.hooks) {
  const int S = peers.sites();
  cc_.sites = S;
  cc_.self = peers.site();
  cc_.quorum = o.outer.quorum(S);
  cc_.retry_s = o.outer.consensus_retry_s;
  cc_.degrade_s = o.outer.consensus_retry_s / 2;
  members_ = all_sites(S);
  first_round_.assign(static_cast<size_t>(S), 0);
}

SiteMask RoundMembership::in_round(uint64_t round) const {
  SiteMask a = members_;
  for (size_t s = 0; s < first_round_.size(); ++s)
    if (first_round_[s] > round) a &= ~(SiteMask{1} << s);
  return a;
}

SiteMask RoundMembership::active(uint64_t round) const {
  SiteMask a = in_round(round);
  if (const auto& lo = hooks_.leave_out; lo && round >= lo->from_round) a &= ~(SiteMask{1} << lo->site);
  return a;
}

SiteMask RoundMembership::pending() const {
  SiteMask p = 0;
  for (size_t s = 0; s < first_round_.size(); ++s)
    if (((members_ >> s) & 1) && first_round_[s] == kNotYet) p |= SiteMask{1} << s;
  return p;
}

void RoundMembership::activate(SiteMask joiners, uint64_t first_round) {
  for (size_t s = 0; s < first_round_.size(); ++s)
    if (((joiners >> s) & 1) && first_round_[s] == kNotYet) first_round_[s] = first_round;
}

void RoundMembership::set_members(SiteMask m) {
  members_ = m;
  std::fill(first_round_.begin(), first_round_.end(), uint64_t{0});
}

double RoundMembership::deadline_s() const {
  if (opt_.outer.deadline_s > 0) return opt_.outer.deadline_s;
  const double floor = opt_.outer.deadline_floor_s;
  if (waits_.empty()) return floor;
  std::vector<double> w(waits_.begin(), waits_.end());
  const size_t k = std::min(w.size() - 1, static_cast<size_t>(0.9 * static_cast<double>(w.size())));
  std::nth_element(w.begin(), w.begin() + static_cast<std::ptrdiff_t>(k), w.end());
  return std::max(floor, 4.0 * w[k]);
}

void RoundMembership::record_wait(double seconds) {
  waits_.push_back(seconds);
  if (waits_.size() > kRecentWaits) waits_.pop_front();
}

SiteMask RoundMembership::vote_site(uint64_t round, SiteMask holds, SiteMask joiners, Site& site) {
  const int self = peers_.site();
  if (const auto& lo = hooks_.leave_out; lo && lo->site == self && round >= lo->from_round)
    throw SiteLeftOut(fmt::format("outer round {}: site {} left out by the test hook", round, opt_.site_name(self)));
  holds = (holds & active(round)) | (joiners & ~active(round));
  if (site.ranks() > 1) {
    const auto all = site.all_gather(std::as_bytes(std::span<const SiteMask>(&holds, 1)));
    for (const auto& b : all) {
      SiteMask m = 0;
      GEOLOCO_CHECK_EQ(b.size(), sizeof m, "membership vote bytes");
      std::memcpy(&m, b.data(), sizeof m);
      holds &= m;
    }
  }
  return holds;
}

std::vector<std::byte> RoundMembership::agree(uint64_t round, SiteMask site_holds, SiteMask expected,
                                              SiteMask in_run) const {
  try {
    if (peers_.sites() == 1) return encode_verdict(Verdict::kDecided, site_holds, true, "");
    ConsensusConfig cc = cc_;
    cc.expected = hooks_.no_fast_path ? 0 : expected;  // the fast path: every site still in holds them all
    cc.in_run = in_run;  // below a majority: sites out of it (the other side of a split) take no part
    // A site that holds every contribution early votes at once, while the others may still be
    // waiting for a late site up to the round's deadline: a site not heard from yet in this
    // round (alive, still in its exchange) is waited for that much longer.
    const auto began = std::chrono::steady_clock::now();
    const MembershipOutcome out =
        agree_membership(peers_, cc, round, site_holds, opt_.outer.quorum_wait_s, &stopping_, deadline_s());
    if (hooks_.on_consensus) {
      auto at = [&](double s) {
        return began +
               std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s));
      };
      OuterHooks::Consensus c;
      c.site = cc_.self;
      c.round = round;
      c.began = began;
      if (out.first_ballot_s >= 0) c.first_ballot = at(out.first_ballot_s);
      c.decided = at(out.seconds);
      c.ballots = out.ballots;
      hooks_.on_consensus(c);
    }
    if (out.foreign)
      spdlog::warn(
          "outer round {}: sites {} decided this round without this side {} (the other side of a partition, "
          "min_sites below a majority); not adopted: this side decided {}, and the heal rule keeps one side",
          round, mask_string(out.foreign), mask_string(in_run), mask_string(out.members));
    return encode_verdict(Verdict::kDecided, out.members, out.can_apply, "");
  } catch (const QuorumLost& e) {
    return encode_verdict(Verdict::kQuorumLost, e.heard(), false, e.what());
  } catch (const std::exception& e) {
    return encode_verdict(Verdict::kError, 0, false, e.what());
  }
}

SiteMask RoundMembership::share(uint64_t round, int64_t step, SiteMask holds, std::vector<std::byte> verdict,
                                const std::vector<std::string>& missing, Site& site) {
  const int S = peers_.sites(), self = peers_.site();
  const std::string& here = opt_.site_name(self);
  if (site.ranks() > 1) {
    auto all = site.all_gather(verdict);
    verdict = std::move(all.at(0));
  }
  GEOLOCO_CHECK_GE(verdict.size(), size_t{10}, "membership verdict bytes");
  const auto v = static_cast<Verdict>(verdict[0]);
  SiteMask members = 0;
  std::memcpy(&members, verdict.data() + 1, 8);
  const bool can_apply = verdict[9] != std::byte{0};
  const std::string msg(reinterpret_cast<const char*>(verdict.data() + 10), verdict.size() - 10);

  // Why the sites this rank did not hear from are not held, for the errors and the log.
  auto reasons = [&](SiteMask sites) {
    std::string r;
    for (int s = 0; s < S; ++s)
      if (((sites >> s) & 1) && s != self)
        r += fmt::format("; {}: {}", opt_.site_name(s),
                         missing[static_cast<size_t>(s)].empty() ? std::string("held here, not by every member")
                                                                 : missing[static_cast<size_t>(s)]);
    return r;
  };
  if (v == Verdict::kQuorumLost) {
    // `members` holds the sites still heard from here: waited for, the others and those
    // heard but whose contribution this site does not hold (the other side of a partition).
    const SiteMask waited = all_sites(S) & ~(members & holds);
    std::string names;
    for (int s = 0; s < S; ++s)
      if ((waited >> s) & 1) names += (names.empty() ? "" : ", ") + opt_.site_name(s);
    throw QuorumLost(fmt::format("{} (site {} waited for {}){}", msg, here, names, reasons(active(round) & ~holds)),
                     members);
  }
  if (v == Verdict::kError) throw Error(msg);
  if (!((members >> self) & 1) || !can_apply)
    throw SiteLeftOut(fmt::format(
        "outer round {} (inner step {}): site {} was left out of the round the others committed (members {}){}; it "
        "stops rather than train on weights it did not receive",
        round, step, here, mask_string(members), reasons(members & ~holds)));

  // Evicted: sites this round expected that are not members. A site admitted by an earlier
  // round and not yet active is neither expected nor evicted here.
  const SiteMask expected = in_round(round);
  SiteMask evicted = 0;
  for (int s = 0; s < S; ++s) {
    if (!((expected >> s) & 1) || ((members >> s) & 1)) continue;
    evicted |= SiteMask{1} << s;
    Eviction e{round, step, s,
               missing[static_cast<size_t>(s)].empty() ? std::string("not held by every member site")
                                                       : missing[static_cast<size_t>(s)]};
    if (peers_.rank() == 0)
      spdlog::warn("outer round {} (inner step {}): site {} evicted: {}; the round commits with {} of {} sites {}",
                   round, step, opt_.site_name(s), e.why, mask_count(members), S, mask_string(members));
    evictions_.push_back(std::move(e));
  }
  // Admitted: members of this round that were not in the run; active once activate() says from
  // which round (the outer loop, once it served them the state).
  for (int s = 0; s < S; ++s) {
    if (((members_ >> s) & 1) || !((members >> s) & 1)) continue;
    first_round_[static_cast<size_t>(s)] = kNotYet;
    if (peers_.rank() == 0)
      spdlog::info(
          "outer round {} (inner step {}): site {} joins the run: a member of this round, it fetches the "
          "committed state from the others and contributes from the next",
          round, step, opt_.site_name(s));
    admissions_.push_back({round, step, s});
  }
  members_ = (members_ & ~evicted) | members;
  return members;
}

}  // namespace geoloco::outer

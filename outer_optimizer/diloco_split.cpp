// After a partition heals, with outer.min_sites below a majority (docs/elastic.md, "After a
// partition heals"): both sides may have committed rounds without each other. Each rank tells
// rank r of every site its site committed a round without (once, when that site leaves the
// round's active set) the members it now commits with; a rank that hears this from a site it
// too committed without knows the run split. The site (every rank, one all-gather) then keeps
// the side with more sites, on a tie the one holding the lowest site index; a site of the
// other side leaves the run (SiteLeftOut, naming both sides and the tokens it trained since
// the split) and rejoins from the kept side (`geoloco launch` restarts it with --join).
//
// Wire (join_wire.hpp's control range): SplitStatus, kControl (0, kSplitShard), envelope
// kSplitStatus, body = 16 bytes little-endian: the sender's members (u64), its round (u64).
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstring>

#include "outer_optimizer/diloco.hpp"
#include "outer_optimizer/join_wire.hpp"
#include "core/error.hpp"

namespace geoloco::outer {

namespace {

std::vector<uint8_t> split_body(SiteMask members, uint64_t round) {
  std::vector<uint8_t> b(16);
  for (int i = 0; i < 8; ++i) {
    b[static_cast<size_t>(i)] = static_cast<uint8_t>(members >> (8 * i));
    b[static_cast<size_t>(8 + i)] = static_cast<uint8_t>(round >> (8 * i));
  }
  return b;
}

uint64_t le64(std::span<const uint8_t> b, size_t at) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | b[at + static_cast<size_t>(i)];
  return v;
}

}  // namespace

bool Diloco::split_possible() const { return peers_.transport() && membership_.quorum() < peers_.sites() / 2 + 1; }

bool split_side_kept(SiteMask ours, SiteMask theirs) {
  const int a = std::popcount(ours), b = std::popcount(theirs);
  if (a != b) return a > b;
  return std::countr_zero(ours) < std::countr_zero(theirs);
}

void Diloco::check_split(uint64_t round, int64_t step) {
  // Sites admitted by a round of this step and not served yet count as in the run.
  const SiteMask active = membership_.active(round) | membership_.pending();
  if (split_watch_.empty()) split_watch_.resize(static_cast<size_t>(peers_.sites()));
  SiteMask theirs = 0;
  for (int s = 0; s < peers_.sites(); ++s) {
    if (s == opt_.site) continue;
    SplitWatch& w = split_watch_[static_cast<size_t>(s)];
    if ((active >> s) & 1) {
      // A member (again, after a join): a later split with it is told anew.
      if (w.told) {
        if (w.recv) w.recv->cancel();
        w = SplitWatch{};
        split_reported_ &= ~(SiteMask{1} << s);
      }
      continue;
    }
    if (auto* t = peers_.transport()) {
      // A connection a cut longer than the transfer timeout broke while both sides live on:
      // dial it again now and then (only the side that dials it acts; Transport::redial), so
      // the sides hear of each other once the link is back.
      const auto now = std::chrono::steady_clock::now();
      if (now >= w.redial_at) {
        t->redial(peers_.peer(s));
        w.redial_at = now + std::chrono::seconds(2);
      }
      // A new connection (redialed, or a new process of that site): told anew.
      if (const uint64_t gen = t->generation(peers_.peer(s)); gen != w.gen) {
        if (w.recv) w.recv->cancel();
        w.recv.reset();
        w.send.reset();
        w.told = false;
        w.gen = gen;
      }
    }
    // With sites of different rank counts only ranks that are each other's partners talk
    // (rank 0 always is); the site acts on the union of what its ranks heard.
    if (!peers_.mutual(s)) continue;
    if (!w.told) {
      // Once per connection: a dead one fails the send (ignored); a restarted one joins, it is no split.
      w.told = true;
      try {
        w.send = peers_.send(s, EnvelopeKind::kSplitStatus, 0, kSplitShard, 0, split_body(active, round));
        w.recv = peers_.post_recv(s, 0, kSplitShard, 16);
      } catch (const transport::TransportError&) {
        w.recv.reset();
      }
    }
    if (w.recv && w.recv->ready()) {
      try {
        std::vector<uint8_t> bytes;
        const Envelope e = peers_.read(*w.recv, s, EnvelopeKind::kSplitStatus, 0, bytes, 16);
        if (e.body.size() != 16)
          throw EnvelopeError(fmt::format("split status of {} bytes, expected 16", e.body.size()));
        const SiteMask m = le64(e.body, 0);
        const uint64_t sent_in = le64(e.body, 8);
        // Only a status sent since this site's side left that site out speaks of a split: an
        // older one was meant for an earlier life of this site (sent when that site evicted
        // it, held by the transport until this process, rejoined since, read it) and is stale.
        uint64_t since = static_cast<uint64_t>(books_.counts_start());  // this process's join round (0: from the start)
        for (const auto& ev : membership_.evictions())
          if (ev.site == s) since = std::max(since, ev.round);
        if (sent_in < since)
          spdlog::info(
              "outer round {}: a split status {} sent in round {} (before this site left it out in round "
              "{}) is stale; ignored",
              round, peers_.name(s), sent_in, since);
        // Its side committed without this site, as this site's did without it: a split.
        else if (m != 0 && !((m >> opt_.site) & 1) && ((m >> s) & 1))
          w.theirs = m;
      } catch (const transport::TransportError&) {
        // The site is gone: nothing to reconcile.
      } catch (const EnvelopeError& e) {
        spdlog::warn("outer round {}: split status from {} refused: {}", round, peers_.name(s), e.what());
      }
      w.recv.reset();
    }
    theirs |= w.theirs;
  }
  // Every rank of the site decides the same: the union of what its ranks heard.
  if (site_.ranks() > 1) {
    for (const auto& b : site_.all_gather(std::as_bytes(std::span<const SiteMask>(&theirs, 1)))) {
      SiteMask m = 0;
      std::memcpy(&m, b.data(), std::min(b.size(), sizeof m));
      theirs |= m;
    }
  }
  theirs &= ~active;
  if (!theirs || (theirs & ~split_reported_) == 0) return;
  split_reported_ |= theirs;
  // Where the split began: the round this site's side evicted theirs.
  uint64_t since = round;
  int64_t since_step = step;
  for (const auto& e : membership_.evictions())
    if ((theirs >> e.site) & 1) {
      since = std::min(since, e.round);
      since_step = std::min(since_step, e.step);
    }
  const bool kept = split_side_kept(active, theirs);
  const int n_kept = std::popcount(kept ? active : theirs), n_other = std::popcount(kept ? theirs : active);
  const std::string why = n_kept != n_other
                              ? fmt::format("{} site(s) against {}", n_kept, n_other)
                              : fmt::format("{} site(s) each, and it holds the lowest site index", n_kept);
  if (kept) {
    if (opt_.rank == 0)
      spdlog::warn(
          "outer round {}: the partition healed: sites {} committed rounds without this side since round {}; this "
          "side ({}) is kept ({}), theirs is discarded and rejoins",
          round, books_.member_names(theirs).dump(), since, books_.member_names(active).dump(), why);
    return;
  }
  const uint64_t lost = books_.tokens_of(std::max<int64_t>(step - since_step, 0));
  throw SiteLeftOut(fmt::format(
      "outer round {}: the partition healed: sites {} committed rounds without this site's side ({}) since round {}; "
      "their side is kept ({}); this side's rounds since then are discarded ({} tokens trained in them, not "
      "committed) and the site leaves the run to rejoin from them",
      round, books_.member_names(theirs).dump(), books_.member_names(active).dump(), since, why, lost));
}

}  // namespace geoloco::outer

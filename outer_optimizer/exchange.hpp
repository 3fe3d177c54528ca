// Exchange: how a round's contributions travel between the sites and become the members'
// average -- the one place the all-to-all exchange and the owner exchange differ, so that a
// round (round_sync.hpp) reads straight through whichever is in force.
//
//   all_to_all (AllToAllExchange, here): every segment of a rank's pseudo-gradient is one frame,
//     sent to the segment's owner rank at every other site; each site decodes every member's
//     frame and sums them in site order.
//   owner (OwnerExchange, owner_exchange.hpp): every segment is S frames (its slices), slice j
//     sent to site j only; each site averages its slice and sends the average back.
// Either way every member ends on the same average, bit for bit.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "outer_optimizer/fragment.hpp"
#include "outer_optimizer/outer_options.hpp"
#include "outer_optimizer/site_peers.hpp"

namespace geoloco {
class TraceRecorder;
}

namespace geoloco::outer {

// What every round of every fragment of this rank needs.
struct ExchangeContext {
  const OuterOptions& opt;
  const SitePeers& peers;
  TraceRecorder* trace = nullptr;
};

class Exchange {
 public:
  virtual ~Exchange() = default;
  virtual ExchangeKind kind() const = 0;

  // Frames per segment: 1, or one per site (its slices).
  virtual size_t frames_per_segment() const = 0;
  // The run of the gathered vector frame j of segment `sg` carries.
  virtual Slice frame(const Segment& sg, size_t j) const = 0;
  // The frames of a round of fragment f in their order (segment after segment), and how many.
  std::vector<Slice> frames(const FragmentState& f) const;
  size_t frame_count(const FragmentState& f) const { return f.segments.size() * frames_per_segment(); }
  // The frame of segment k this rank sends site s, and the one whose size bounds what a site
  // sends this rank (indices into frames()).
  virtual size_t sent_to(size_t k, int s) const = 0;
  virtual size_t received(size_t k) const = 0;

  // While the frames travel: this rank's own error figures, where the exchange has them before
  // the average (the owner exchange: it never decodes its own frames otherwise).
  virtual void own_error(const ExchangeContext& ctx, FragmentState& f, Round& r) const = 0;
  // Once every contribution was collected (or the deadline passed): the owner exchange's second
  // phase; nothing for all-to-all.
  virtual void after_contributions(const ExchangeContext& ctx, FragmentState& f, Round& r, SiteMask active,
                                   std::chrono::steady_clock::time_point deadline, double deadline_s,
                                   int tid) const = 0;
  // The members' average into r.avg, for a round decided with `members` (contributors, every
  // one held): `env`, by member site and segment, the envelope of the frame it sent this rank
  // (this rank's own included); `tokens` by site (outer.weighting: tokens). Adds this rank's
  // error figures unless the round knows them (r.inbox.err_known).
  virtual void average(const ExchangeContext& ctx, FragmentState& f, Round& r, SiteMask members,
                       const std::vector<std::vector<Envelope>>& env, const std::vector<uint64_t>& tokens, double& err2,
                       double& ref2) const = 0;
};

class AllToAllExchange final : public Exchange {
 public:
  ExchangeKind kind() const override { return ExchangeKind::AllToAll; }
  size_t frames_per_segment() const override { return 1; }
  Slice frame(const Segment& sg, size_t) const override { return {sg.begin, sg.end}; }
  size_t sent_to(size_t k, int) const override { return k; }
  size_t received(size_t k) const override { return k; }
  void own_error(const ExchangeContext&, FragmentState&, Round&) const override {}
  void after_contributions(const ExchangeContext&, FragmentState&, Round&, SiteMask,
                           std::chrono::steady_clock::time_point, double, int) const override {}
  void average(const ExchangeContext& ctx, FragmentState& f, Round& r, SiteMask members,
               const std::vector<std::vector<Envelope>>& env, const std::vector<uint64_t>& tokens, double& err2,
               double& ref2) const override;
};

// The exchange of `kind` (AllToAll or Owner) between `sites` sites, this one `self`.
std::unique_ptr<Exchange> make_exchange(ExchangeKind kind, int sites, int self);

// The round's weight of each site in `members` (site order): 1/|members|, or by the tokens its
// envelope reported under outer.weighting: tokens. Throws Error when no member reported any
// and `require_tokens` (a rank with elements to average).
std::vector<float> member_weights(Weighting weighting, uint64_t round, SiteMask members, int sites,
                                  const std::vector<uint64_t>& tokens, bool require_tokens);

// The squared error of this rank's contribution as the sites decode it (r.decoded against the
// pseudo-gradient r.delta), and the squared values: a round's err2 and ref2.
void add_own_error(const FragmentState& f, const Round& r, double& err2, double& ref2);

}  // namespace geoloco::outer

// outer.exchange: owner -- the exchange whose bytes per site do not grow with the site count
// (docs/shapes.md, "Many sites").
//
// All-to-all (the default) sends every segment of a rank's shard to the piece's owner at every
// other site: (S-1) shards out per site per round. Here every segment is cut into S slices,
// slice j owned by site j (config order), and a round has two phases:
//
//   1. a rank sends slice j of its compressed pseudo-gradient to the segment's owner rank at site
//      j only (error feedback on the slice's part of its residual, as today), and receives every
//      other site's frame of its own slice;
//   2. once every site's slice is in, it averages them in site order (uniform, or by tokens) and
//      encodes the average once more -- with error feedback of its own, the owner residual --
//      and sends that frame to every other site, receiving theirs of their slices.
//
// Every site then decodes the same S frames of every segment, so the global weights stay
// bit-identical, while each site sends 2(S-1)/S of a shard per round. It costs two latency-bound
// phases instead of one, and a second quantization (of the average, its error fed back by the
// owner). A site lost between the phases would leave its slice's average with nobody: the config
// requires every site in every round (outer.min_sites = S), so such a round loses its quorum
// and the run stops with the checkpoint that --resume exchanges again (docs/elastic.md).
//
// On the wire both phases reuse the pieces' keys: phase 1 FrameKind::kPseudoGradient and phase 2
// FrameKind::kAverage, tagged (round, piece), each inside an Envelope checked as every
// contribution is (phase 2's value: the mask of the sites averaged, which must be the round's).
#pragma once

#include <chrono>
#include <cstddef>
#include <span>

#include "outer_optimizer/exchange.hpp"

namespace geoloco::outer {

class OwnerExchange final : public Exchange {
 public:
  OwnerExchange(int sites, int self) : sites_(sites), self_(self) {}
  ExchangeKind kind() const override { return ExchangeKind::Owner; }
  size_t frames_per_segment() const override { return static_cast<size_t>(sites_); }
  Slice frame(const Segment& sg, size_t j) const override;
  size_t sent_to(size_t k, int s) const override { return k * frames_per_segment() + static_cast<size_t>(s); }
  size_t received(size_t k) const override { return sent_to(k, self_); }
  // This rank's contribution as the owners decode it, slice by slice, while the frames travel.
  void own_error(const ExchangeContext& ctx, FragmentState& f, Round& r) const override;
  // Phase 2, once phase 1 is in (r.inbox.holds): when every active site's slice arrived,
  // average them, encode with the owner residual (into r.owner_next, committed by average()),
  // send to every active site and receive theirs until `deadline`. A site whose average does
  // not arrive (or is malformed, or averaged other sites) is dropped from holds with the
  // reason in missing. When a slice is missing nothing is sent: the round cannot be decided
  // with every site and stops the run (the config requires them all).
  void after_contributions(const ExchangeContext& ctx, FragmentState& f, Round& r, SiteMask active,
                           std::chrono::steady_clock::time_point deadline, double deadline_s, int tid) const override;
  // The average of every segment from the averages' frames (this site's own included), for a
  // round decided with `members` (which must be the sites the owners averaged over); the
  // round's owner residual becomes the fragment's.
  void average(const ExchangeContext& ctx, FragmentState& f, Round& r, SiteMask members,
               const std::vector<std::vector<Envelope>>& env, const std::vector<uint64_t>& tokens, double& err2,
               double& ref2) const override;

 private:
  int sites_, self_;
};

// Slice `site` of `sg` out of `sites` (contiguous, balanced, in the fragment's gathered vector).
Slice owner_slice(const Segment& sg, int site, int sites);

// The owner residual is kept for the elements `site` owns only, segment after segment: about
// 1/S of the fragment. owned_count: its size; expand_owned / gather_owned: between it and the
// fragment's gathered vector (zero at the elements others own).
size_t owned_count(const FragmentState& f, int site, int sites);
void expand_owned(const FragmentState& f, int site, int sites, std::span<const float> owned, std::span<float> gathered);
void gather_owned(const FragmentState& f, int site, int sites, std::span<const float> gathered, std::span<float> owned);

}  // namespace geoloco::outer

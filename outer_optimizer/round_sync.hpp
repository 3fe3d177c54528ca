// One fragment's round (steps 1-4 of diloco.hpp) in two halves around its membership decision
// (round_membership.hpp): collect_round (pseudo-gradient, compress, exchange until the
// deadline; on the fragment's worker thread when the sync overlaps compute) and apply_round
// (the members' average, the outer step; on the inner loop's thread). How the frames travel
// and become the average is the exchange's (exchange.hpp: all-to-all or owner). Touches no
// site collective: the membership vote, the site's all-gather and the merge stay on the inner
// loop's thread (diloco.cpp), so every rank calls them at the same step.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "outer_optimizer/exchange.hpp"
#include "outer_optimizer/fragment.hpp"

namespace geoloco::outer {

// The fragment's segments: its elements cut by the pieces of this rank's shard.
std::vector<Segment> cut_segments(const std::vector<Range>& local, ShardRange shard, const ExchangeLayout& layout,
                                  int site, int rank);
// Each segment's hash of `values` (the fragment's gathered vector).
std::vector<uint64_t> segment_hashes(const std::vector<Segment>& segments, std::span<const float> values);
std::vector<PieceHash> piece_hashes(const std::vector<Segment>& segments, const std::vector<uint64_t>& hashes);

// Steps 1-2 of round `round` of fragment f from `local` (its values, gathered; may be r.delta
// itself: the pseudo-gradient is computed in place): pseudo-gradient, compress, send to every
// site in `active` and receive theirs until `deadline_s` after the receives were posted. A
// site that does not deliver in time, whose connection fails or whose envelope is malformed is
// not held (r.inbox.missing says why); its operations are cancelled. Verifies the fragment's
// previous hash check last. Fills r.inbox; may run on the worker. `again`: this rank's
// contribution to a round exchanged again after --resume, sent as made before.
void collect_round(FragmentState& f, Round& r, const Exchange& exchange, const ExchangeContext& ctx, int64_t step,
                   uint64_t round, uint64_t tokens, std::span<const float> local, SiteMask active, double deadline_s,
                   int tid, const OwnContribution* again = nullptr);

// Steps 3-4 once the round's members are decided (every member held, self included): the
// members' average (uniform, or by their tokens) in site order, the outer step on f.global,
// and the hash check posted to the members (verified at the fragment's next round).
// `joiners`: members taken in by this round (join requests, no contribution): left out of the
// average and of the hash check; they fetch the state this round commits.
ExchangeResult apply_round(FragmentState& f, Round& r, const Exchange& exchange, const ExchangeContext& ctx,
                           SiteMask members, SiteMask joiners, int tid);

// Overlap: collect_round() from r.delta (the snapshot) on the round's worker thread;
// join_worker() rethrows its error on the inner loop's thread.
void launch_worker(FragmentState& f, Round& r, const Exchange& exchange, const ExchangeContext& ctx, int64_t step,
                   uint64_t round, uint64_t tokens, SiteMask active, double deadline_s, int tid);
void join_worker(Round& r);

}  // namespace geoloco::outer

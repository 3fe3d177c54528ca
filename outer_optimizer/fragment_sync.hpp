// One fragment's round of the outer loop (steps 1-4 of diloco.hpp) in two halves around the
// round's membership decision (round_membership.hpp): collect_round (send, receive until the
// deadline; on the fragment's worker thread when the sync overlaps compute) and apply_round
// (average over the members, outer step; on the inner loop's thread). Touches no collective:
// the membership vote, the site's all-gather and the merge stay on the inner loop's thread
// (diloco.cpp), so every rank calls them at the same step.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include "compression/error_feedback.hpp"
#include "compression/pipeline.hpp"
#include "outer_optimizer/fragments.hpp"
#include "outer_optimizer/hash_check.hpp"
#include "outer_optimizer/membership.hpp"
#include "outer_optimizer/outer_hooks.hpp"
#include "outer_optimizer/outer_optimizer.hpp"
#include "outer_optimizer/site_peers.hpp"
#include "trainer/loop/device_outer.hpp"
#include "trainer/loop/outer_hook.hpp"

namespace geoloco::outer {

struct ExchangeResult {
  uint64_t envelope_bytes = 0, frame_bytes = 0, elements = 0;
  uint64_t sent_bytes = 0;  // envelope bytes this rank sent to the other sites (both phases of an owner exchange)
  double ratio = 0;
  uint64_t hash = 0;                   // of the fragment's new global weights
  std::vector<uint64_t> segment_hash;  // by segment
  // This rank's own contribution as every site decoded it against the pseudo-gradient it
  // encoded: sum of squared errors and of squared values (relative error = sqrt(err2/ref2)).
  double err2 = 0, ref2 = 0;
  SiteMask members = 0;           // the round's members: contributors and joiners
  SiteMask joiners = 0;           // members taken in by this round (no contribution)
  double wait_s = 0;              // this rank: from posting its receives to the last contribution (or the deadline)
  double membership_s = 0;        // the site's membership decision
  std::vector<uint64_t> tokens;   // by site: the tokens a contributor's envelope reported (0: not one)
  std::vector<uint32_t> step_us;  // by site: a contributor's step time under outer.pace: time (0: none)
  // By site: the attachment of a contributor's envelope (empty: none, or not a contributor).
  std::vector<std::vector<uint8_t>> attachments;
};

// What one round gathered before its membership is decided (collect_round). Per segment
// (Fragment::segments): one envelope each way with each site.
struct RoundInbox {
  uint64_t round = 0;
  int64_t step = 0;
  std::vector<transport::Payload> mine;                  // by segment: this rank's envelope
  std::vector<std::vector<std::vector<uint8_t>>> bytes;  // by site, by segment: the envelope it sent (held sites only)
  SiteMask holds = 0;                         // sites whose whole, well-formed contribution arrived (self included)
  std::vector<std::string> missing;           // by site: why its contribution is not held ("" if held or not asked)
  std::vector<compression::FrameInfo> infos;  // by segment: this rank's frames
  compression::FrameInfo info;                // their totals (elements, raw and frame bytes)
  std::vector<uint64_t> max_frame;            // by segment: the largest frame a site may send for it
  double wait_s = 0;
  // outer.exchange: owner (owner_exchange.hpp): `mine`, `infos` and `max_frame` are by
  // (segment, owner site), k * S + j; bytes[s][k] is site s's frame of this site's slice of
  // segment k. The second phase's:
  std::vector<transport::Payload> mine_avg;                  // by segment: this site's average of its slice
  std::vector<std::vector<std::vector<uint8_t>>> avg_bytes;  // by site, by segment: its average of its slice
  SiteMask averaged = 0;                                     // the sites the averages are over (0: none sent)
  uint64_t sent_bytes = 0;    // envelope bytes this rank posted to other sites in the round (both phases)
  double err2 = 0, ref2 = 0;  // this rank's contribution as decoded (ExchangeResult's), when err_known
  bool err_known = false;     // owner exchange, or quantized on the device: err2/ref2 set by collect_round
};

// The part of a fragment that lies in one piece of the parameters (exchange_layout.hpp): its
// own frame, exchanged with the piece's owner at every other site. With sites of one rank
// count a fragment has one segment, the whole of it.
struct Segment {
  uint32_t piece = 0;
  size_t begin = 0, end = 0;  // into the fragment's gathered vectors
  size_t size() const { return end - begin; }
};

// A run of a fragment's gathered vector that travels as one frame: a segment, or one of its
// slices under outer.exchange: owner (owner_exchange.hpp).
struct Slice {
  size_t begin = 0, end = 0;
  size_t size() const { return end - begin; }
};

// One fragment's part of this rank's shard and its outer-loop state.
struct Fragment {
  int index = 0;
  std::vector<Range> local;       // ranges within this rank's shard
  size_t n = 0;                   // elements on this rank (may be 0)
  std::vector<Segment> segments;  // one per piece of this rank's shard, in order (some may be empty)
  std::vector<float> global;      // the fragment's global weights, gathered in range order
  // delta: the snapshot of the local values at launch, then (in place) the pseudo-gradient.
  std::vector<float> delta, decoded, avg;
  std::unique_ptr<compression::Pipeline> pipeline;
  std::unique_ptr<compression::ErrorFeedback> ef;
  // outer.exchange: owner with error feedback: the error of this site's averages, for the
  // elements of the slices it owns only (owner_exchange.hpp: owned_count); owner_next: the
  // round's, until applied.
  std::unique_ptr<compression::ErrorFeedback> owner_ef;
  std::vector<float> owner_next;
  std::unique_ptr<OuterOptimizer> opt;
  // outer.quantize_on: its rounds are quantized on the device (trainer/loop/device_outer.hpp;
  // `ef` is then the host copy of the device residual, refreshed by Diloco::residuals_to_host),
  // and the round's slices as the device quantized them, set by the snapshot.
  bool on_device = false;
  std::optional<trainer::StagedRound> staged;
  // This rank's attachment to its next round's envelope (envelope.hpp; outer.plan: auto's
  // reports and decisions), set before collect_round.
  std::vector<uint8_t> attachment;
  uint32_t step_us = 0;                // outer.pace: time: the site's step time for its next envelope
  int64_t rounds_done = 0;             // since it was built (its first round pays its first-touch costs)
  int64_t last_sync_step = 0;          // launch step of its latest round
  int64_t last_sync_trained = 0;       // outer.pace: time: the rank's trained steps at that launch
  int64_t blocking_step = -1;          // step of its latest blocking sync
  uint64_t hash = 0;                   // hash of `global`
  std::vector<uint64_t> segment_hash;  // by segment: hash of its part of `global`
  // The cross-site check of this fragment's latest round, posted and not yet verified
  // (verified before the fragment's next round, a checkpoint, a re-plan and the run's end).
  std::optional<HashCheck> check;
  // Overlap: the worker owns global/delta/decoded/avg/pipeline/ef/opt while
  // in_flight; the inner loop touches them only after join().
  std::thread worker;
  bool in_flight = false, pending_merge = false, joined = false;
  int64_t merge_step = 0, launch_step = 0;
  uint64_t round = 0;
  RoundInbox inbox;  // the round being decided (collect_round -> apply_round)
  // Overlap: at vote_step the site votes on the round's membership and its leader starts the
  // consensus on `agreer` (its verdict lands in `verdict`); the merge shares and applies it.
  int64_t vote_step = 0;
  bool voted = false;
  bool awaiting_decision = false;  // launched, membership not applied yet (main thread only)
  SiteMask site_holds = 0;
  std::vector<std::byte> verdict;
  std::thread agreer;
  double vote_s = 0;  // exposed: the vote's collective and the wait for the collection
  ExchangeResult result;
  std::exception_ptr error;
  std::chrono::steady_clock::time_point t0, t1;
  double joined_seconds = 0;
};

// What every round of every fragment of this rank needs.
struct ExchangeContext {
  const trainer::RunConfig& cfg;
  const SitePeers& peers;
  const OuterHooks& hooks;
  trainer::TraceRecorder* trace = nullptr;
  // The exchange in force: outer.exchange: owner, or the plan's under exchange: auto (set
  // by the inner loop's thread between rounds only: at start and at a re-plan).
  bool owner = false;
};

// Steps 1-2 of one round on `local` (the fragment's values, gathered): pseudo-gradient,
// compress, send to every site in `active`, and receive theirs until `deadline_s` after the
// receives were posted (outer.exchange: owner: both phases, owner_exchange.hpp). A site that does not deliver in time, whose connection fails or whose
// envelope is malformed is not held (inbox.missing says why); its operations are cancelled.
// Verifies the fragment's previous hash check first. Fills f.inbox; may run on the worker.
// `again`: this rank's contribution to the round as made before (a round exchanged again
// after --resume from the checkpoint its lost quorum left): sent as is, not encoded again
// (the error-feedback residual already holds its encoding error).
struct OwnContribution {
  std::vector<transport::Payload> envelopes;  // by segment
  std::vector<compression::FrameInfo> infos;
};
// The frames of a round of fragment f, in collect_round's order: each segment whole, or under
// outer.exchange: owner its S slices (owner_slice), segment after segment.
std::vector<Slice> round_slices(const Fragment& f, bool owner, int sites);
// The fragment's segments: its elements cut by the pieces of this rank's shard.
std::vector<Segment> cut_segments(const std::vector<Range>& local, parallel::ShardRange shard,
                                  const ExchangeLayout& layout, int site, int rank);
// Each segment's hash of `values` (the fragment's gathered vector).
std::vector<uint64_t> segment_hashes(const std::vector<Segment>& segments, std::span<const float> values);
std::vector<PieceHash> piece_hashes(const std::vector<Segment>& segments, const std::vector<uint64_t>& hashes);
void collect_round(Fragment& f, const ExchangeContext& ctx, int64_t step, uint64_t round, uint64_t tokens,
                   std::span<const float> local, SiteMask active, double deadline_s, int tid,
                   const OwnContribution* again = nullptr);

// Steps 3-4 once the round's members are decided (every member held, self included): decode
// the members' contributions and average them in site order (uniform over the members, or by
// their tokens), outer step on f.global, and post the hash check to the members (verified at
// the fragment's next round). `joiners`: members taken in by this round (join requests, no
// contribution): left out of the average and of the hash check; they fetch the state this
// round commits. Runs on the inner loop's thread.
ExchangeResult apply_round(Fragment& f, const ExchangeContext& ctx, SiteMask members, SiteMask joiners, int tid);

// Overlap: runs collect_round() on the fragment's worker thread from f.delta (the snapshot);
// join_worker() rethrows its error on the inner loop's thread.
void launch_worker(Fragment& f, const ExchangeContext& ctx, int64_t step, uint64_t round, uint64_t tokens,
                   SiteMask active, double deadline_s, int tid);
void join_worker(Fragment& f);

}  // namespace geoloco::outer

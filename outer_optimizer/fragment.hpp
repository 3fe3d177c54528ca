// A fragment of this rank's shard (fragment_plan.hpp cuts the model into them): what persists
// between its rounds (FragmentState: its cut of the shard, global weights, outer optimizer,
// error feedback, hashes, schedule books) apart from its round in flight (Round: the round's
// buffers, what it collected, the worker collecting it, its membership decision). A fragment
// has at most one round in flight.
//
// Vectors of a fragment are "gathered": its ranges of the shard one after the other. Within a
// fragment, a segment is its part of one piece of the parameters (exchange_layout.hpp: the
// frames are exchanged piece by piece with each piece's owner rank at the other sites), and a
// slice is the run of a segment one frame carries (a whole segment, or under the owner
// exchange one of its S slices: owner_exchange.hpp).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "compression/error_feedback.hpp"
#include "compression/pipeline.hpp"
#include "outer_optimizer/device_outer.hpp"
#include "outer_optimizer/fragment_plan.hpp"
#include "outer_optimizer/hash_check.hpp"
#include "outer_optimizer/membership.hpp"
#include "outer_optimizer/outer_optimizer.hpp"
#include "transport/transport.hpp"

namespace geoloco::outer {

struct Segment {
  uint32_t piece = 0;
  size_t begin = 0, end = 0;  // into the fragment's gathered vectors
  size_t size() const { return end - begin; }
};

struct Slice {
  size_t begin = 0, end = 0;
  size_t size() const { return end - begin; }
};

// What one round's exchange gathered before its membership is decided (round_sync.hpp's
// collect_round). Per frame of the round (exchange.hpp: one per segment, or per segment and
// owner site): one envelope each way with each site.
struct RoundInbox {
  uint64_t round = 0;
  int64_t step = 0;
  std::vector<transport::Payload> mine;                  // by frame: this rank's envelope
  std::vector<std::vector<std::vector<uint8_t>>> bytes;  // by site, by segment: the envelope it sent (held sites only)
  SiteMask holds = 0;                         // sites whose whole, well-formed contribution arrived (self included)
  std::vector<std::string> missing;           // by site: why its contribution is not held ("" if held or not asked)
  std::vector<compression::FrameInfo> infos;  // by frame: this rank's frames
  compression::FrameInfo info;                // their totals (elements, raw and frame bytes)
  std::vector<uint64_t> max_frame;            // by frame: the largest frame a site may send for it
  double wait_s = 0;
  // outer.exchange: owner, the second phase (owner_exchange.hpp):
  std::vector<transport::Payload> mine_avg;                  // by segment: this site's average of its slice
  std::vector<std::vector<std::vector<uint8_t>>> avg_bytes;  // by site, by segment: its average of its slice
  SiteMask averaged = 0;                                     // the sites the averages are over (0: none sent)
  uint64_t sent_bytes = 0;    // envelope bytes this rank posted to other sites in the round (both phases)
  double err2 = 0, ref2 = 0;  // this rank's contribution as decoded (ExchangeResult's), when err_known
  bool err_known = false;     // owner exchange, or quantized on the device: err2/ref2 set by collect_round
};

// What a round committed, for the books (outer_books.hpp) and the next round.
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

// This rank's contribution to a round as it made it: sent as is when the round is exchanged
// again after --resume (not encoded again: the error-feedback residual already holds its error).
struct OwnContribution {
  std::vector<transport::Payload> envelopes;  // by frame
  std::vector<compression::FrameInfo> infos;
};

// What persists of a fragment between its rounds.
struct FragmentState {
  int index = 0;
  std::vector<Range> local;       // ranges within this rank's shard
  size_t n = 0;                   // elements on this rank (may be 0)
  std::vector<Segment> segments;  // one per piece of this rank's shard, in order (some may be empty)
  std::vector<float> global;      // the fragment's global weights, gathered
  std::unique_ptr<compression::Pipeline> pipeline;
  // Error feedback of this rank's contributions (on a GPU site that quantizes on the device,
  // the host copy of the device's residual: FragmentStore::residual_to_host).
  std::unique_ptr<compression::ErrorFeedback> ef;
  // outer.exchange: owner with error feedback: the error of this site's averages, for the
  // elements of the slices it owns only (owner_exchange.hpp: owned_count).
  std::unique_ptr<compression::ErrorFeedback> owner_ef;
  std::unique_ptr<OuterOptimizer> opt;
  uint64_t hash = 0;                   // of `global`
  std::vector<uint64_t> segment_hash;  // by segment: of its part of `global`
  // The cross-site check of its latest round, posted and not yet verified (verified before its
  // next round, a checkpoint, a re-plan and the run's end).
  std::optional<HashCheck> check;
  int64_t rounds_done = 0;        // since it was built (its first round pays its first-touch costs)
  int64_t last_sync_step = 0;     // launch step of its latest round
  int64_t last_sync_trained = 0;  // outer.pace: time: the rank's trained steps at that launch
  int64_t blocking_step = -1;     // step of its latest blocking sync
};

// A fragment's round in flight (overlap), or the blocking round being synced.
struct Round {
  uint64_t number = 0;
  int64_t launch_step = 0, merge_step = 0;
  // delta: the snapshot of the local values, then (in place) the pseudo-gradient; decoded: a
  // frame decoded; avg: the members' average. Sized at the snapshot, pooled between rounds
  // (round_buffers.hpp). owner_next: the owner residual the round makes, until applied.
  std::vector<float> delta, decoded, avg, owner_next;
  std::optional<StagedRound> staged;  // quantized on the device by the snapshot (fragment_store.hpp)
  // This rank's attachment to the round's envelopes (envelope.hpp; outer.plan: auto's reports
  // and decisions) and, under outer.pace: time, the site's step time they carry.
  std::vector<uint8_t> attachment;
  uint32_t step_us = 0;
  RoundInbox inbox;  // collect_round -> apply_round

  // Overlap: the worker owns the fragment's state and this round's buffers while in_flight;
  // the inner loop's thread touches them only after join_worker().
  std::thread worker;
  bool in_flight = false;
  std::exception_ptr error;
  std::chrono::steady_clock::time_point t0, t1;
  bool joined = false;  // the worker was joined: joined_seconds is the collection's time
  double joined_seconds = 0;

  // The decision: at vote_step the site votes on the round's membership and its leader starts
  // the consensus on `agreer` (its verdict lands in `verdict`); the merge shares and applies it.
  bool pending_merge = false;      // launched (or restored), not merged yet
  bool awaiting_decision = false;  // launched, membership not applied yet (inner loop's thread only)
  int64_t vote_step = 0;
  bool voted = false;
  SiteMask site_holds = 0;
  std::vector<std::byte> verdict;
  std::thread agreer;
  double vote_s = 0;  // exposed: the vote's collective and the wait for the collection
  ExchangeResult result;
};

struct Fragment {
  FragmentState state;
  Round round;
};

// The fragment's values gathered from `shard` (its ranges in order), and their inverse.
void gather_local(const FragmentState& f, std::span<const float> shard, std::span<float> out);
void scatter_local(const FragmentState& f, std::span<const float> gathered, std::span<float> shard);

}  // namespace geoloco::outer

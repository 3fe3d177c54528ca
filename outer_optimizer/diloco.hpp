// Diloco: geoloco's outer loop for one rank of one site (DiLoCo, Douillard et al. 2023),
// driven by any inner loop through the seam it owns (site.hpp: this rank's shard of the
// parameters, a small exchange among the site's ranks, sinks) and built from plain options
// (outer_options.hpp). The driver calls after_inner_step() after every inner step; the outer
// loop syncs when its schedule says, and writes the new global weights into the shard.
//
// A round of fragment f (rank r of every site, in parallel with the site's other ranks):
//   1. snapshot: f's part of the shard, or on a GPU site quantized on the device
//      (fragment_store.hpp); the pseudo-gradient delta = global - local;
//   2. compress (error feedback optional) and exchange with the other sites: each piece of the
//      shard (exchange_layout.hpp) with its owner rank at every other site, all-to-all or
//      through each slice's owner site (exchange.hpp, owner_exchange.hpp), until the round's
//      deadline (round_sync.hpp: collect_round);
//   3. decide the round's members with the other sites, no coordinator (round_membership.hpp:
//      the site's ranks vote, the leaders agree, the verdict is shared); a site left out is
//      evicted, a site that asked to join is taken in (diloco_join.cpp), a site on the other
//      side of a healed partition may have to leave (diloco_split.cpp);
//   4. average the members' contributions in site order (uniform, or by tokens) and apply the
//      outer optimizer to f's global weights (apply_round): every member computes the same bits;
//   5. merge: the shard's part of f becomes the new global weights (blocking), or
//      alpha * local + (1 - alpha) * global tau steps later (overlap: steps 1-2 ran on a worker
//      thread behind the inner loop, step 3's vote halfway); the site all-gathers.
// The new global weights' hash is posted to the members and verified at f's next round (a
// mismatch stops the run); the pieces' hashes combine into the site-wide hash that is logged.
//
// When: the pure schedule (schedule.hpp) turns the step, the plan in force and the rounds in
// flight into the step's actions. Fragments (outer.fragments = F, fragment_plan.hpp) sync at
// staggered offsets within every H steps, each with its own global weights, outer optimizer,
// error feedback and round in flight (fragment.hpp); rounds are numbered in the global order of
// all syncs. The last step syncs every fragment blocking, so all sites end bit-identical. With
// F = 1 and tau = 0 this is the plain outer loop, bit for bit.
//
// Around the rounds: outer.plan: auto (plan_coordinator.hpp decides, diloco_plans.cpp applies a
// plan at a boundary, carrying the state across the new cut); outer.pace: time (pace.hpp: a
// slower site trains a share of each period's steps); a lost quorum (the undecided rounds kept
// for --resume to exchange again); checkpoints (diloco_state.cpp); joins (diloco_join.cpp); the
// books behind metrics and the summary (outer_books.hpp, diloco_records.cpp).
#pragma once

#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <vector>

#include "core/safetensors.hpp"
#include "outer_optimizer/auto_plan.hpp"
#include "outer_optimizer/exchange.hpp"
#include "outer_optimizer/fragment.hpp"
#include "outer_optimizer/fragment_store.hpp"
#include "outer_optimizer/outer_books.hpp"
#include "outer_optimizer/outer_options.hpp"
#include "outer_optimizer/outer_state.hpp"
#include "outer_optimizer/pace.hpp"
#include "outer_optimizer/plan_coordinator.hpp"
#include "outer_optimizer/round_buffers.hpp"
#include "outer_optimizer/round_membership.hpp"
#include "outer_optimizer/schedule.hpp"
#include "outer_optimizer/site.hpp"
#include "outer_optimizer/site_peers.hpp"
#include "outer_optimizer/state_transfer.hpp"
#include "transport/transport.hpp"

namespace geoloco::outer {

// After a partition healed with min_sites below a majority: whether the side `ours` is kept
// against `theirs` (more sites; on a tie, the lowest site index). diloco_split.cpp.
bool split_side_kept(SiteMask ours, SiteMask theirs);

class Diloco {
 public:
  // `transport` connects this rank to the ranks of the other sites it exchanges with (null for
  // a one-site run); `site` is this rank's side of the seam and outlives the outer loop. Unless
  // options.joining, checks with every other site that all start from the same weights.
  Diloco(OuterOptions options, transport::Transport* transport, Site& site);
  ~Diloco();
  Diloco(const Diloco&) = delete;
  Diloco& operator=(const Diloco&) = delete;

  // ---- what the driver calls, every rank of the site at the same step ----
  // Before inner step `step` (1-based): false when the site skips it (outer.pace: time).
  bool trains_step(int64_t step);
  // After inner step `step`: runs what the schedule says (merges, votes, syncs, launches, plan
  // boundaries) and serves the sites a round took in. May overwrite the shard (and then calls
  // Site::shard_updated). True when an outer round completed at this step.
  bool after_inner_step(int64_t step);
  // After the last inner step: every fragment synced blocking (all sites end equal).
  void finish(int64_t step);
  // Fields for each metrics line, the finished rounds' records, and the summary.
  nlohmann::json metrics();
  std::vector<nlohmann::json> take_rounds() { return books_.take_records(); }
  nlohmann::json summary();
  // The outer loop's host bytes for this rank's shard, by part, and per parameter.
  nlohmann::json memory_json() const;

  // ---- checkpoints (diloco_state.cpp) ----
  OuterState save_state();
  void restore_state(const SafetensorsFile& file);
  // After a failure of after_inner_step/finish: whether the driver should checkpoint now (a
  // round whose quorum was lost: --resume exchanges it again with this rank's contribution).
  bool checkpoint_after_failure() const { return !retries_.empty(); }
  // After --resume restored a checkpoint of step `step`, before the next inner step.
  void resumed(int64_t step);
  // --resume: the newest of `steps` (this site's checkpoints every rank holds) every site
  // holds (site leaders exchange their lists); -1: none, start fresh. Collective.
  int64_t agree_resume_step(const std::vector<int64_t>& steps);

  // ---- joins (diloco_join.cpp) ----
  // This site joins the running job: fetches the state the running sites committed, verifies
  // it, writes its global weights into the shard, and returns the inner step it was committed
  // at (the driver continues from there; its inner optimizer starts fresh).
  int64_t join();

  int64_t rounds() const { return round_; }
  uint64_t site_hash() const { return site_hash_; }
  const std::vector<FragmentPlan>& fragment_plans() const { return plans_; }
  int64_t interval() const { return interval_; }
  // The plan in effect (epoch 0: the config's own schedule) and every plan of the run.
  const PlanDecision& plan() const { return plan_; }
  const std::vector<PlanDecision>& plan_history() const { return plan_history_; }
  // The sites in the run: the latest round's members.
  SiteMask members() const { return membership_.members(); }

 private:
  // The outer state in shard layout, whatever the fragments: checkpoints, re-plans, joins.
  struct ShardState {
    std::vector<float> global, opt_a, opt_b, ef;  // empty: not kept by this optimizer/codec
    std::vector<float> owner_ef;                  // outer.exchange: owner: the owner residual
  };
  // A round a lost quorum left undecided, exchanged again after --resume with the
  // contribution this rank made to it.
  struct Retry {
    int fragment = 0;
    uint64_t round = 0;
    int64_t step = 0;        // its launch step
    int64_t merge_step = 0;  // its merge step (= step: a blocking round)
    OwnContribution mine;
  };

  // ---- the schedule (diloco.cpp) ----
  StepState step_state(int64_t step) const;
  // The actions after the step's merges (votes, the last step's syncs, plan boundaries,
  // launches, a checkpoint's decisions); `any`: whether a round finished at this step so far.
  bool run_rest(int64_t step, const std::vector<Action>& rest, bool any);
  void final_sync(int64_t step);
  // With overlap at a checkpoint step: the rounds in flight decided now.
  void decide_in_flight();

  // ---- the round life cycle (diloco.cpp) ----
  // Blocking sync of one fragment; `again`: a round exchanged again after --resume.
  void sync(Fragment& f, int64_t step, const Retry* again = nullptr);
  // Overlap: its round started on its worker; later joined, decided, merged.
  void launch(Fragment& f, int64_t step);
  void complete(Fragment& f);
  // The round's snapshot (its buffers sized from the pool first).
  void snapshot(Fragment& f, bool quantize = true);
  // The site's vote on a collected round; the leader's consensus inline or on the agreer.
  void vote(Fragment& f, bool background);
  // The round's membership (collectives), then its average and outer step.
  ExchangeResult decide_and_apply(Fragment& f, int tid);
  // decide_and_apply of an overlapped round; a quorum lost there keeps every round then
  // undecided (retries_, and whether the step's merges were running) for the checkpoint.
  ExchangeResult decide_or_keep(Fragment& f);
  // With overlap: the rounds launched and not decided when `failed`'s quorum was lost, in
  // round order (their workers joined).
  std::vector<Retry> undecided_rounds(Fragment& failed);
  // The site hash (a collective) and the books of a finished round.
  void finish_round(Fragment& f, int64_t step, uint64_t round, double seconds, const ExchangeResult& r);
  void record_round(const Fragment& f, int64_t step, uint64_t round, double seconds,
                    const ExchangeResult& r);  // diloco_records.cpp
  void verify_pending_checks();
  uint64_t round_tokens(Fragment& f, int64_t step);
  int trace_tid(const Fragment& f) const;
  bool overlapped() const { return opt_.outer.overlapped(); }
  int64_t tau() const { return opt_.outer.delayed_update ? interval_ : opt_.outer.overlap_steps; }
  // By piece of this rank's shard: the hash of its global weights, and their site-wide hash.
  std::vector<uint64_t> piece_hashes() const;
  uint64_t combine_site_hash(const std::vector<uint64_t>& pieces);

  // ---- plans and the fragments' state (diloco_plans.cpp) ----
  // Fragments cut for `fragments` under the interval in force, global weights from `global`
  // (shard layout), fresh state; the store and the round buffers follow.
  void build_fragments(int fragments, std::span<const float> global);
  // A plan's interval, codec, exchange, active lanes and fragments (fresh state).
  void set_schedule(const PlanDecision& d, std::span<const float> global);
  void apply_plan(const PlanDecision& d, int64_t step, bool initial);
  void log_plan(const PlanDecision& d, int64_t step) const;
  void prefault_round_buffers();
  ShardState pack_state();
  void unpack_state(const ShardState& st);  // also refreshes each fragment's hash
  // The owner residual from shard layout, for the elements of the slices this site owns.
  void restore_owner_residual(FragmentState& f, std::span<const float> shard) const;
  std::vector<float> pack_owner_residual() const;
  // One vector of every fragment (`get`) as views in shard layout, in order (no copy).
  std::vector<std::span<const float>> shard_views(const std::function<std::span<const float>(FragmentState&)>& get);

  // ---- checkpoints (diloco_state.cpp) ----
  // A checkpoint's or a join's outer state; a join has no error feedback.
  void restore_outer(const SafetensorsFile& file, bool joining);

  // ---- joins (diloco_join.cpp) ----
  SiteMask poll_join_requests(uint64_t round);
  // Sites the rounds of this step took in are served the committed state once the step's
  // syncs and merges are done (and, with overlap, every round still in flight decided and
  // merged now); they take part in the rounds launched from then on.
  void serve_admitted(int64_t step);
  void serve_joiners(SiteMask joiners, int64_t step);
  nlohmann::json joins_json() const;

  // ---- after a healed partition (diloco_split.cpp) ----
  bool split_possible() const;
  void check_split(uint64_t round, int64_t step);

  const OuterOptions opt_;
  const OuterConfig& ocfg_;
  Site& site_;
  SitePeers peers_;
  ExchangeContext ctx_;
  RoundMembership membership_;
  PlanCoordinator planner_;
  OuterBooks books_;
  SitePace pace_;
  RoundBufferPool buffers_;
  const size_t n_;                 // shard elements
  const ShardRange shard_;         // this rank's shard of the flat parameters
  DeviceOuter* device_ = nullptr;  // outer.quantize_on: the device side of a GPU site (null: the host)
  const bool gpu_site_;

  // The schedule in force (outer.interval / the config's, or the plan's).
  int64_t interval_;
  compression::PipelineConfig pcfg_;
  std::unique_ptr<Exchange> exchange_;
  int64_t epoch_start_ = 0;  // fragment f syncs at s > epoch_start_, (s - epoch_start_) % H == offset
  std::vector<FragmentPlan> plans_;
  std::vector<std::unique_ptr<Fragment>> frags_;
  std::unique_ptr<FragmentStore> store_;
  PlanDecision plan_;
  std::vector<PlanDecision> plan_history_;
  bool planned_ = false;  // a plan is in force (always under plan: manual)

  // Times the plan protocol measures: inner steps (from the end of one call to the start of
  // the next) and fragment syncs, since the last boundary.
  std::chrono::steady_clock::time_point last_call_end_{};
  int64_t first_step_ = 0;  // the step before this process's first inner step
  std::vector<double> step_times_, boundary_syncs_;

  int64_t round_ = 0;
  int64_t step_ = 0;  // the inner step this rank is at (the latest after_inner_step, a restore, a join)
  uint64_t site_hash_ = 0;

  // A lost quorum. retries_: the rounds undecided when it was lost (saved by the failure's
  // checkpoint); resume_retries_: those a checkpoint restored, exchanged again by resumed().
  // With overlap, whether it was lost in the step's merges (the rest of that step -- votes, a
  // plan boundary, launches -- is still to run after a resume).
  std::vector<Retry> retries_, resume_retries_;
  bool retry_rest_ = false, resume_retry_rest_ = false;
  bool in_merges_ = false;  // the step's merges are running (or resumed() replays them)
  struct FlagScope {        // sets a flag for a scope, whatever leaves it
    bool& flag;
    const bool was;
    FlagScope(bool& f, bool now) : flag(f), was(f) { flag = now; }
    ~FlagScope() { flag = was; }
  };

  // Joins. Per site, one watch per joiner rank this rank serves (SitePeers::partnered_by): its
  // request, reposted when the peer's connection is a new one; held when every one asked.
  struct JoinWatch {
    int rank = 0;
    uint64_t gen = 0;
    std::optional<transport::RecvHandle> recv;
    bool requested = false;
  };
  struct Served {
    uint64_t round = 0;
    int64_t step = 0;
    int site = 0;
    const JoinDonor* donor = nullptr;  // while it runs; bytes below once it finished
    uint64_t bytes = 0;
  };
  struct Joins {
    std::vector<std::vector<JoinWatch>> watch;
    SiteMask admitted = 0;  // taken in by a round of this step, not served yet
    std::vector<std::unique_ptr<JoinDonor>> donors;
    std::vector<Served> served;
    nlohmann::json own;  // this site's own join (null if it started with the run)
  } joins_;

  // After a partition with min_sites below a majority (diloco_split.cpp).
  struct SplitWatch {
    uint64_t gen = 0;                                   // the connection told (Transport::generation)
    std::chrono::steady_clock::time_point redial_at{};  // next Transport::redial of a lost connection
    bool told = false;
    std::optional<transport::SendHandle> send;
    std::optional<transport::RecvHandle> recv;
    SiteMask theirs = 0;  // the members a site committed with, without this one
  };
  std::vector<SplitWatch> split_watch_;
  SiteMask split_reported_ = 0;
};

}  // namespace geoloco::outer

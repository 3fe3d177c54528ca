// Diloco: the outer loop of one rank (DiLoCo, Douillard et al. 2023), shard-parallel.
//
// At each sync, rank r of every site:
//   1. computes its pseudo-gradient on its shard: delta = global - local;
//   2. compresses it (error feedback optional) and sends it to rank r of every other site,
//      receiving theirs (one UCX connection -- or `lanes` -- per peer pair, in parallel
//      with every other rank of the site); with sites of different rank counts, each piece
//      of the shard (exchange_layout.hpp) is its own frame, exchanged with that piece's
//      owner at every other site;
//   3. decides with the other sites which sites' contributions are in the round (its
//      membership: round_membership.hpp), decodes every member's frame, its own included,
//      and sums them in site order with the member weights -- so every member computes
//      bit-identical averages; a site left out is evicted;
//   4. applies the outer optimizer to its shard of the global weights;
//   5. overwrites its local shard with the new global shard; the site all-gathers.
// Then the shard hashes are compared with the other sites (a mismatch stops the run) and
// combined into a site-wide hash that is logged.
//
// Streaming fragments (outer.fragments = F, fragments.hpp): steps 1-5 run per fragment, at
// the fragment's own offset within every `interval` steps, on the part of the shard that
// belongs to the fragment. Each fragment has its own global weights, outer-optimizer and
// error-feedback state and compression pipeline; its rounds are numbered in the global
// order of all syncs (the same on every site), which keys its frames on the wire.
//
// Overlap (outer.overlap_steps = tau > 0, or outer.delayed_update): steps 1-4 of a fragment
// run on a worker thread of that fragment from a snapshot of its local values taken at the
// sync step, while the inner loop keeps training; tau steps later the inner loop joins the
// worker (the exposed wait) and merges: local <- alpha * local + (1 - alpha) * global, then
// the site all-gathers. Several fragments may be in flight at once (tau > interval / F).
// Joins and merges happen on the inner loop's thread at fixed steps, so every rank calls the
// site's collectives at the same step and every site computes the same global weights. The
// last step of the run syncs every fragment blocking, so all sites end bit-identical.
// With F = 1 and tau = 0 all of this is the plain outer loop, bit for bit.
//
// The pieces: fragment_sync.hpp (steps 1-4 of one fragment's round, its worker thread),
// hash_check.hpp (the cross-site check), plan_coordinator.hpp (outer.plan: auto between
// sites), site_peers.hpp (who the other sites are on the transport); this class schedules
// them, merges, all-gathers and keeps the books; diloco_state.cpp is its checkpoint.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <vector>

#include "outer_optimizer/auto_plan.hpp"
#include "outer_optimizer/fragment_sync.hpp"
#include "outer_optimizer/outer_config.hpp"
#include "outer_optimizer/outer_hooks.hpp"
#include "outer_optimizer/pace.hpp"
#include "outer_optimizer/plan_coordinator.hpp"
#include "outer_optimizer/round_membership.hpp"
#include "outer_optimizer/site_peers.hpp"
#include "outer_optimizer/state_transfer.hpp"
#include "trainer/loop/outer_hook.hpp"
#include "trainer/loop/run_config.hpp"
#include "transport/transport.hpp"

namespace geoloco::outer {

// After a partition healed with min_sites below a majority: whether the side `ours` is kept
// against `theirs` (more sites; on a tie, the lowest site index). diloco_split.cpp.
bool split_side_kept(SiteMask ours, SiteMask theirs);

class Diloco : public trainer::OuterHook {
 public:
  // `transport` connects this rank to rank r of every other site (null for a one-site run);
  // its peers are found by site name and rank. `layout` is the model's parameter layout
  // (fragments are cut along it). `hooks` are a test's or benchmark's (outer_hooks.hpp).
  // `joining`: this site joins a running job (join() follows): no start-up check with the
  // other sites, which are far past it.
  Diloco(const trainer::RunConfig& cfg, int site, int rank, transport::Transport* transport,
         trainer::SiteStrategy& strategy, const trainer::ParamLayout& layout, OuterHooks hooks = {},
         bool joining = false);
  ~Diloco() override;
  Diloco(const Diloco&) = delete;
  Diloco& operator=(const Diloco&) = delete;

  // outer.pace: time (pace.hpp): whether this site trains inner step `step`.
  bool trains_step(int64_t step) override;
  bool after_inner_step(int64_t step, trainer::SiteStrategy& strategy) override;
  void finish(int64_t step, trainer::SiteStrategy& strategy) override;
  nlohmann::json metrics() override;
  nlohmann::json summary() override;
  // The outer loop's host bytes for this rank's shard, by part, and per parameter of the shard.
  nlohmann::json memory_json() const;
  std::vector<nlohmann::json> take_rounds() override;
  State save_state() override;                                        // diloco_state.cpp
  void restore_state(const trainer::SafetensorsFile& file) override;  // diloco_state.cpp
  int64_t join(trainer::SiteStrategy& strategy) override;             // diloco_join.cpp
  // A blocking round whose quorum was lost: the trainer checkpoints, and --resume exchanges
  // that round again (resumed) with the contribution this rank made to it.
  bool checkpoint_after_failure() const override { return !retries_.empty(); }
  void resumed(int64_t step, trainer::SiteStrategy& strategy) override;  // diloco_state.cpp
  // --resume: the newest checkpoint step every site holds (site leaders exchange their lists).
  int64_t agree_resume_step(const std::vector<int64_t>& steps, trainer::SiteStrategy& strategy) override;
  void set_trace(trainer::TraceRecorder* trace) override { ctx_.trace = trace; }
  uint64_t member_sites() const override { return membership_.members(); }

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
  // The outer state in shard layout (whatever the fragments): checkpoints and re-plans.
  struct ShardState {
    std::vector<float> global, opt_a, opt_b, ef;  // empty: not kept by this optimizer/codec
    std::vector<float> owner_ef;                  // outer.exchange: owner: the owner residual
  };
  // A fragment's round buffers (delta: the snapshot, then the pseudo-gradient; decoded, avg): sized when its round starts,
  // released when it is applied if there are several fragments.
  void begin_round_buffers(Fragment& f);
  void end_round_buffers(Fragment& f);
  // Several fragments: the buffers of rounds done, reused by the next round that starts (their
  // pages stay mapped: no page faults per round); at most as many sets as were ever in flight.
  struct RoundBuffers {
    std::vector<float> delta, decoded, avg;
  };
  std::vector<RoundBuffers> buffer_pool_;
  // Allocates and touches what the rounds of the fragments just built will use (their round
  // buffers, or one pooled set; each pipeline's scratch), off the sync's path.
  void prefault_round_buffers();
  ShardState pack_state() const;
  // One vector of every fragment (`get`) as views in shard layout (diloco_state.cpp).
  std::vector<std::span<const float>> shard_views(const std::function<std::span<const float>(Fragment&)>& get);
  void unpack_state(const ShardState& st);  // also refreshes each fragment's hash
  // Fragments cut for `fragments`, global weights from `global` (shard layout), fresh state.
  void build_fragments(int fragments, std::span<const float> global);
  // A plan's interval, codec, active lanes and fragments (fresh state).
  void set_schedule(const PlanDecision& d, std::span<const float> global);
  void apply_plan(const PlanDecision& d, int64_t step, trainer::SiteStrategy& strategy, bool initial);
  void log_plan(const PlanDecision& d, int64_t step) const;

  // diloco_state.cpp: a checkpoint's or a join's outer state; a join has no error feedback.
  void restore_outer(const trainer::SafetensorsFile& file, bool joining);

  // ---- joins (diloco_join.cpp) ----
  // The sites out of round `round` whose request to join this rank holds.
  SiteMask poll_join_requests(uint64_t round);
  // Sites that rounds of this step took in (admitted_): once the step's syncs and merges are
  // done, and with overlap every round still in flight decided and merged now (as a
  // checkpoint does), the committed state is served to each of them; they take part in the
  // rounds launched from then on (RoundMembership::activate).
  void serve_admitted(int64_t step, trainer::SiteStrategy& strategy);
  void serve_joiners(SiteMask joiners, int64_t step, trainer::SiteStrategy& strategy);
  // The outer loop's part of an inner step (after_inner_step without the joins' service):
  // the merges due, then after_merges (votes, the last step's syncs, plan boundaries,
  // launches); `any`: whether a round finished at this step so far.
  bool schedule_step(int64_t step, trainer::SiteStrategy& strategy);
  bool after_merges(int64_t step, trainer::SiteStrategy& strategy, bool any);
  nlohmann::json joins_json() const;

  bool overlapped() const;
  int64_t tau() const;
  int trace_tid(const Fragment& f) const;
  uint64_t tokens_since(int64_t step, int64_t since) const;
  // The tokens of fragment f's round launched at `step`: since its previous launch (under
  // outer.pace: time the steps this site trained, and f.step_us set: a collective).
  uint64_t round_tokens(Fragment& f, int64_t step, trainer::SiteStrategy& strategy);
  void gather_local(const Fragment& f, std::span<const float> shard, std::span<float> out) const;
  // Its inverse: the fragment's gathered values to their places in `shard`.
  void scatter_local(const Fragment& f, std::span<const float> gathered, std::span<float> shard) const;
  // The round's snapshot: on a GPU site with outer.quantize_on (f.on_device) quantized on the
  // device into f.staged (trainer/loop/device_outer.hpp), or (`quantize` false: a round sent
  // again after --resume) the shard gathered into f.delta.
  void snapshot(Fragment& f, trainer::SiteStrategy& strategy, bool quantize = true);
  // After its outer step: the shard's part of fragment f becomes its global weights (alpha < 0)
  // or alpha * local + (1 - alpha) * global, and the site's replica is made consistent.
  void merge_global(Fragment& f, trainer::SiteStrategy& strategy, float alpha);
  // The fragments' device residuals into their host copies (f.ef), before anything reads them.
  void residuals_to_host() const;
  // Fragment f (built, or restored) to the device: its runs, global weights and residual.
  void define_on_device(const Fragment& f) const;
  // The owner residual from shard layout, for the elements of the slices this site owns under
  // the current fragments (owned elsewhere before a re-plan: zero).
  void restore_owner_residual(Fragment& f, std::span<const float> shard) const;
  // The owner residual in shard layout (zero where other sites own the elements).
  std::vector<float> pack_owner_residual() const;
  // Blocking sync of one fragment (the plain outer loop when F = 1).
  // `again`: the round is one a lost quorum left undecided, exchanged again after --resume.
  // A round its quorum was lost in (or launched and undecided then, with overlap): exchanged
  // again after --resume with the contribution this rank made to it.
  struct Retry {
    int fragment = 0;
    uint64_t round = 0;
    int64_t step = 0;        // its launch step
    int64_t merge_step = 0;  // its merge step (= step: a blocking round)
    OwnContribution mine;
  };
  // With overlap: the rounds launched and not decided when `failed`'s quorum was lost, in
  // round order (their workers joined).
  std::vector<Retry> undecided_rounds(Fragment& failed);
  void sync(Fragment& f, int64_t step, trainer::SiteStrategy& strategy, const Retry* again = nullptr);
  // Overlap: start a fragment's round on its worker; join + merge + all-gather.
  void launch(Fragment& f, int64_t step, trainer::SiteStrategy& strategy);
  void complete(Fragment& f, trainer::SiteStrategy& strategy);
  // The round's membership (collectives: every rank at the same point), then steps 3-4.
  ExchangeResult decide_and_apply(Fragment& f, int tid, trainer::SiteStrategy& strategy);
  // The site's vote on a collected round; the leader's consensus inline or on f.agreer.
  void vote(Fragment& f, trainer::SiteStrategy& strategy, bool background);
  // Site hash (a collective) and accounting of a finished round.
  void finish_round(Fragment& f, trainer::SiteStrategy& strategy, int64_t step, uint64_t round, double seconds,
                    const ExchangeResult& r);
  // The round's line for rounds.r<rank>.jsonl (take_rounds).
  void record_round(const Fragment& f, int64_t step, uint64_t round, double seconds, const ExchangeResult& r);
  // Syncs (blocking) every fragment not yet blocking-synced at `step`: the run's end.
  void final_sync(int64_t step, trainer::SiteStrategy& strategy);
  // By piece of this rank's shard (exchange_layout.hpp): the hash of its global weights.
  std::vector<uint64_t> piece_hashes() const;

  nlohmann::json member_names(SiteMask m) const;
  uint64_t combine_site_hash(trainer::SiteStrategy& strategy, const std::vector<uint64_t>& pieces);
  void verify_pending_checks();

  const trainer::RunConfig& cfg_;
  const OuterConfig& ocfg_;
  int site_, rank_;
  const OuterHooks hooks_;
  trainer::SiteStrategy* strategy_;  // the site's (outlives this): save_state's membership vote
  SitePeers peers_;
  ExchangeContext ctx_;
  RoundMembership membership_;
  size_t n_;                    // shard elements
  parallel::ShardRange shard_;  // this rank's shard of the flat parameter buffer
  trainer::ParamLayout layout_;
  int64_t interval_;                  // H in effect (outer.interval, or the plan's)
  compression::PipelineConfig pcfg_;  // compression in effect
  int64_t epoch_start_ = 0;           // fragment f syncs at s > epoch_start_, (s - epoch_start_) % H == offset
  std::vector<FragmentPlan> plans_;
  std::vector<std::unique_ptr<Fragment>> frags_;

  // Tokens, for the summary (checkpointed: diloco_state.cpp). committed_tokens_[s]: the tokens
  // of site s's contributions in the rounds this site applied, each fragment's round weighted
  // by its share of the parameters (so a token counts once when every fragment committed it).
  // trained_steps_: the inner steps this site trained (this process and those before it).
  std::vector<double> committed_tokens_;
  int64_t trained_steps_ = 0;
  // outer.pace: time: the share of each period this site trains; skipped_step_: the latest
  // step trains_step() said this site skips (it trains every other step).
  Pace pace_;
  int64_t skipped_step_ = -1;
  nlohmann::json pace_history_ = nlohmann::json::array();  // {round, step, ratio} as decided
  // The site's step time for the next contribution (a collective: every rank at a launch).
  uint32_t agreed_step_us(trainer::SiteStrategy& strategy);
  // After a committed round: the site's ratio for the next period (a collective).
  void decide_pace(trainer::SiteStrategy& strategy, uint64_t round, int64_t step, const ExchangeResult& r);
  nlohmann::json pace_json() const;  // the share in force: rounds.jsonl and the summary
  int64_t tokens_first_round_ = 0;   // the round the counts start after (a joiner's join round)
  nlohmann::json tokens_json() const;
  void restore_tokens(const trainer::SafetensorsFile& file);  // diloco_state.cpp

  // outer.plan: auto.
  PlanCoordinator planner_;
  PlanDecision plan_;
  std::vector<PlanDecision> plan_history_;
  bool planned_ = false;  // the start-up plan is in effect (or plan: manual)
  std::chrono::steady_clock::time_point last_hook_end_{};
  int64_t first_step_ = 0;                     // the step before this process's first inner step
  std::vector<double> step_times_;             // inner step times since the last boundary
  std::vector<double> boundary_syncs_;         // fragment sync times since the last boundary
  std::vector<nlohmann::json> round_records_;  // finished rounds not yet taken by the trainer
  int64_t round_ = 0;
  int64_t step_ = 0;  // the inner step this rank is at (the latest after_inner_step, a restore, a join)
  uint64_t site_hash_ = 0;
  // retries_: the rounds undecided when this rank's quorum was lost (saved by the failure's
  // checkpoint); resume_retries_: those restored from a checkpoint, exchanged again by resumed().
  std::vector<Retry> retries_, resume_retries_;
  // With overlap: whether the quorum was lost in the step's merges (the rest of that step --
  // votes, a plan boundary, launches -- is still to run after a resume), not after its launches.
  bool retry_rest_ = false, resume_retry_rest_ = false;
  bool in_merges_ = false;  // the merges due at a step are running (schedule_step, or resumed() replaying them)
  struct MergesRunning {    // sets in_merges_ for a scope, whatever leaves it
    bool& flag;
    const bool was;
    MergesRunning(bool& f, bool now) : flag(f), was(f) { flag = now; }
    ~MergesRunning() { flag = was; }
  };
  // decide_and_apply of an overlapped round; a quorum lost there keeps every round then
  // undecided (retries_, and whether the step's merges were running) for the checkpoint.
  ExchangeResult decide_or_keep(Fragment& f, trainer::SiteStrategy& strategy);
  // A periodic checkpoint at this step: its rounds in flight are decided now, at the end of
  // the step (save_state would), so that a quorum lost there ends the step with a checkpoint.
  void decide_in_flight(trainer::SiteStrategy& strategy);

  // Joins. Live side: per site, the join request being watched (reposted when the peer's
  // connection is a new one) and whether it is held; the donors serving joiners.
  // By site: one watch per joiner rank this rank serves (SitePeers::partnered_by); the site's
  // request is held here when every one of them asked.
  struct JoinWatch {
    int rank = 0;  // the joiner rank watched
    uint64_t gen = 0;
    std::optional<transport::RecvHandle> recv;
    bool requested = false;
  };
  std::vector<std::vector<JoinWatch>> join_watch_;
  SiteMask admitted_ = 0;  // taken in by a round of this step, not served yet
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
  bool split_possible() const;
  void check_split(uint64_t round, int64_t step, trainer::SiteStrategy& strategy);
  std::vector<std::unique_ptr<JoinDonor>> donors_;
  struct Served {
    uint64_t round = 0;
    int64_t step = 0;
    int site = 0;
    const JoinDonor* donor = nullptr;  // while it runs; bytes below once it finished
    uint64_t bytes = 0;
  };
  std::vector<Served> served_;
  nlohmann::json joined_;  // this site's own join (null if it started with the run)

  // Measurements.
  std::vector<double> sync_seconds_;
  uint64_t frame_bytes_total_ = 0, elements_total_ = 0;
  uint64_t round_buffer_peak_ = 0;  // bytes: the most the rounds' buffers held at once
  // outer.quantize_on: the device side of a GPU site (null: every round on the host), and the
  // bytes its rounds copied to the host against what fp32 staging copies.
  trainer::DeviceOuter* device_ = nullptr;
  bool gpu_site_ = false;
  uint64_t snapshot_host_bytes_ = 0, snapshot_fp32_bytes_ = 0;
  double last_sync_s_ = 0;
};

}  // namespace geoloco::outer

// Diloco: the outer loop of one rank (DiLoCo, Douillard et al. 2023), shard-parallel.
//
// At each sync, rank r of every site:
//   1. computes its pseudo-gradient on its shard: delta = global - local;
//   2. compresses it (error feedback optional) and sends it to rank r of every other site,
//      receiving theirs (one UCX connection -- or `lanes` -- per peer pair, in parallel
//      with every other rank of the site);
//   3. decodes every site's frame, its own included, and sums them in site order with the
//      site weights -- so every site computes bit-identical averages;
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
#pragma once

#include <chrono>
#include <exception>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <span>
#include <thread>
#include <vector>

#include "compression/error_feedback.hpp"
#include "compression/pipeline.hpp"
#include "outer_optimizer/auto_plan.hpp"
#include "outer_optimizer/envelope.hpp"
#include "outer_optimizer/fragments.hpp"
#include "outer_optimizer/outer_config.hpp"
#include "outer_optimizer/outer_optimizer.hpp"
#include "trainer/loop/outer_hook.hpp"
#include "trainer/loop/run_config.hpp"
#include "transport/transport.hpp"

namespace geoloco::outer {

class Diloco : public trainer::OuterHook {
 public:
  // `transport` connects this rank to rank r of every other site (null for a one-site run);
  // its peers must be ordered as the other sites appear in cfg.sites. `layout` is the
  // model's parameter layout (fragments are cut along it).
  Diloco(const trainer::RunConfig& cfg, int site, int rank, transport::Transport* transport,
         trainer::SiteStrategy& strategy, const trainer::ParamLayout& layout);
  ~Diloco() override;
  Diloco(const Diloco&) = delete;
  Diloco& operator=(const Diloco&) = delete;

  bool after_inner_step(int64_t step, trainer::SiteStrategy& strategy) override;
  void finish(int64_t step, trainer::SiteStrategy& strategy) override;
  nlohmann::json metrics() override;
  nlohmann::json summary() override;
  State save_state() override;
  void restore_state(const trainer::SafetensorsFile& file) override;
  void set_trace(trainer::TraceRecorder* trace) override { trace_ = trace; }

  int64_t rounds() const { return round_; }
  uint64_t site_hash() const { return site_hash_; }
  const std::vector<FragmentPlan>& fragment_plans() const { return plans_; }
  int64_t interval() const { return interval_; }
  // The plan in effect (epoch 0: the config's own schedule) and every plan of the run.
  const PlanDecision& plan() const { return plan_; }
  const std::vector<PlanDecision>& plan_history() const { return plan_history_; }

 private:
  struct ExchangeResult {
    uint64_t envelope_bytes = 0, frame_bytes = 0, elements = 0;
    double ratio = 0;
    uint64_t hash = 0;  // of the fragment's new global weights
  };
  // A message in flight (plan protocol on rank 0, weights-hash checks): its buffer lives
  // until done.
  struct ControlOp {
    int site = 0;
    std::shared_ptr<std::vector<uint8_t>> buf;  // outlives a failed run: see ~Diloco
    transport::OpHandle op;
  };
  // A posted weights-hash exchange (outer.check_hash): the hash this site sent for `round`
  // and the peers' replies still arriving. Buffers are shared: the transport may still own
  // them when a failed run unwinds (kept until exit then, see ~Diloco).
  struct HashCheck {
    uint64_t round = 0, hash = 0;
    std::shared_ptr<std::vector<uint8_t>> mine;
    std::vector<std::pair<int, ControlOp>> recvs;  // (site, op)
    std::vector<transport::OpHandle> sends;
  };
  // One fragment's part of this rank's shard and its outer-loop state.
  struct Fragment {
    int index = 0;
    std::vector<Range> local;     // ranges within this rank's shard
    size_t n = 0;                 // elements on this rank (may be 0)
    std::vector<float> global;    // the fragment's global weights, gathered in range order
    std::vector<float> delta, decoded, avg, snapshot;
    std::unique_ptr<compression::Pipeline> pipeline;
    std::unique_ptr<compression::ErrorFeedback> ef;
    std::unique_ptr<OuterOptimizer> opt;
    int64_t last_sync_step = 0;   // launch step of its latest round
    int64_t blocking_step = -1;   // step of its latest blocking sync
    uint64_t hash = 0;            // hash of `global`
    // The cross-site check of this fragment's latest round, posted and not yet verified
    // (verified before the fragment's next round, a checkpoint, a re-plan and the run's end).
    std::optional<HashCheck> check;
    // Overlap: the worker owns global/delta/decoded/avg/snapshot/pipeline/ef/opt while
    // in_flight; the inner loop touches them only after join().
    std::thread worker;
    bool in_flight = false, pending_merge = false, joined = false;
    int64_t merge_step = 0, launch_step = 0;
    uint64_t round = 0;
    ExchangeResult result;
    std::exception_ptr error;
    std::chrono::steady_clock::time_point t0, t1;
    double joined_seconds = 0;
  };

  // outer.plan: auto (auto_plan.hpp).
  // The outer state in shard layout (whatever the fragments): checkpoints and re-plans.
  struct ShardState {
    std::vector<float> global, opt_a, opt_b, ef;  // empty: not kept by this optimizer/codec
  };
  ShardState pack_state() const;
  void unpack_state(const ShardState& st);  // also refreshes each fragment's hash
  // Fragments cut for `fragments`, global weights from `global` (shard layout), fresh state.
  void build_fragments(int fragments, std::span<const float> global);
  // A plan's interval, codec, active lanes and fragments (fresh state).
  void set_schedule(const PlanDecision& d, std::span<const float> global);
  PathMeasurement probe_sites();  // rank 0, on probe_thread_
  void initial_plan(int64_t step, trainer::SiteStrategy& strategy);
  // The protocol at a period boundary; true when a new schedule was applied here.
  bool plan_boundary(int64_t step, trainer::SiteStrategy& strategy);
  void apply_plan(const PlanDecision& d, int64_t step, trainer::SiteStrategy& strategy, bool initial);
  PlanRequest plan_request(const PathMeasurement& path, double step_time_s, double capacity_scale) const;
  // Site 0's rank 0 decides, every other site's rank 0 receives: same bytes everywhere.
  std::vector<uint8_t> site_broadcast(trainer::SiteStrategy& strategy, std::vector<uint8_t> mine);
  void drain_plan_protocol();
  void send_control(int site, EnvelopeKind kind, uint64_t round, uint32_t shard, uint64_t value, const std::string& body,
                    std::vector<ControlOp>& into);
  void post_control_recv(int site, uint64_t round, uint32_t shard, std::vector<ControlOp>& into);
  Envelope read_control(ControlOp& op, EnvelopeKind kind, uint64_t round) const;
  void log_plan(const PlanDecision& d, int64_t step) const;

  bool overlapped() const;
  int64_t tau() const;
  int trace_tid(const Fragment& f) const;
  uint64_t tokens_since(int64_t step, int64_t since) const;
  void gather_local(const Fragment& f, std::span<const float> shard, std::span<float> out) const;
  // Blocking sync of one fragment (the plain outer loop when F = 1).
  void sync(Fragment& f, int64_t step, trainer::SiteStrategy& strategy);
  // Steps 1-4 on `local` (the fragment's values, gathered): pseudo-gradient, compress,
  // exchange, decode, average, outer step on f.global, then the cross-site hash check of
  // the new global weights (outer.check_hash). Touches no collective.
  ExchangeResult exchange(Fragment& f, int64_t step, uint64_t round, uint64_t tokens, std::span<const float> local,
                          int tid);
  // Overlap: start a fragment's round on its worker; join it; join + merge + all-gather.
  void launch(Fragment& f, int64_t step, trainer::SiteStrategy& strategy);
  void join(Fragment& f);
  void complete(Fragment& f, trainer::SiteStrategy& strategy);
  // Site hash (a collective) and accounting of a finished round.
  void finish_round(Fragment& f, trainer::SiteStrategy& strategy, int64_t step, uint64_t round, double seconds,
                    const ExchangeResult& r);
  // Syncs (blocking) every fragment not yet blocking-synced at `step`: the run's end.
  void final_sync(int64_t step, trainer::SiteStrategy& strategy);
  uint64_t combined_hash() const;
  uint64_t combine_site_hash(trainer::SiteStrategy& strategy, uint64_t shard_hash);
  // The weights-hash check, in two halves: post (send ours, receive theirs) and verify
  // (wait, compare: a mismatch stops the run naming the round and both sites). Rounds verify
  // their check at the fragment's next round, so it costs no round trip on the sync path.
  HashCheck post_hash_check(uint64_t shard_hash, uint64_t round);
  void verify_hash_check(HashCheck& c);
  void verify_pending_checks();
  void keep_until_exit(const HashCheck& c);
  std::string peer_name(int site) const;

  const trainer::RunConfig& cfg_;
  const OuterConfig& ocfg_;
  int site_, rank_;
  transport::Transport* transport_;
  std::vector<int> peer_of_site_;  // site index -> transport peer index (-1 for self)
  size_t n_;                       // shard elements
  parallel::ShardRange shard_;     // this rank's shard of the flat parameter buffer
  trainer::ParamLayout layout_;
  int64_t interval_;                     // H in effect (outer.interval, or the plan's)
  compression::PipelineConfig pcfg_;     // compression in effect
  int64_t epoch_start_ = 0;              // fragment f syncs at s > epoch_start_, (s - epoch_start_) % H == offset
  std::vector<FragmentPlan> plans_;
  std::vector<std::unique_ptr<Fragment>> frags_;

  // outer.plan: auto.
  PlanDecision plan_;
  std::vector<PlanDecision> plan_history_;
  bool planned_ = false;                 // the start-up plan is in effect (or plan: manual)
  std::chrono::steady_clock::time_point last_hook_end_{};
  int64_t first_step_ = 0;               // the step before this process's first inner step
  std::vector<double> step_times_;       // inner step times since the last boundary
  std::vector<double> boundary_syncs_;   // fragment sync times since the last boundary
  int64_t boundary_ = 0;                 // boundaries seen in this plan epoch
  std::optional<PlanDecision> next_due_; // site 0: decided now, applied at the next boundary
  nlohmann::json own_report_;            // site 0: its own report of the previous boundary
  std::vector<ControlOp> report_recvs_, report_sends_, decision_recvs_, decision_sends_;
  int replans_ = 0, recalibrations_ = 0;
  std::thread probe_thread_;
  std::optional<PathMeasurement> probe_path_;
  std::exception_ptr probe_error_;
  int64_t round_ = 0;
  uint64_t site_hash_ = 0;
  trainer::TraceRecorder* trace_ = nullptr;  // spans of the sync's phases (null: none)

  // Measurements.
  std::vector<double> sync_seconds_;
  uint64_t frame_bytes_total_ = 0, elements_total_ = 0;
  double last_sync_s_ = 0;
};

}  // namespace geoloco::outer

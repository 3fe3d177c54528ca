// Diloco: the schedule of the outer loop -- which fragment syncs at which step, blocking or
// overlapped, merges and all-gathers on the inner loop's thread, plans applied at period
// boundaries, and the books (metrics, summary). See diloco.hpp.
#include "outer_optimizer/diloco.hpp"

#include "outer_optimizer/owner_exchange.hpp"
#include "outer_optimizer/membership_driver.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <numeric>
#include <optional>
#include <utility>

#include "trainer/loop/metrics.hpp"
#include "trainer/core/error.hpp"
#include "trainer/core/hash.hpp"

namespace geoloco::outer {

namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

Diloco::Diloco(const trainer::RunConfig& cfg, int site, int rank, transport::Transport* transport,
               trainer::SiteStrategy& strategy, const trainer::ParamLayout& layout, OuterHooks hooks, bool joining)
    : cfg_(cfg),
      ocfg_(cfg.outer),
      site_(site),
      rank_(rank),
      hooks_(std::move(hooks)),
      strategy_(&strategy),
      peers_(cfg, site, rank, transport),
      ctx_{cfg, peers_, hooks_, nullptr, cfg.outer.owner_exchange() && cfg.sites.size() > 1},
      membership_(cfg, peers_, hooks_),
      n_(strategy.shard_params().size()),
      layout_(layout),
      interval_(ocfg_.interval),
      pcfg_(ocfg_.compression),
      planner_(cfg, peers_, layout_, hooks_) {
  const int S = static_cast<int>(cfg.sites.size());
  auto shard = strategy.shard_params();
  join_watch_.resize(static_cast<size_t>(S));
  for (int s = 0; s < S; ++s)
    if (s != site && transport)
      for (int q : peers_.partnered_by(s)) {
        JoinWatch w;
        w.rank = q;
        join_watch_[static_cast<size_t>(s)].push_back(std::move(w));
      }
  committed_tokens_.assign(static_cast<size_t>(S), 0.0);
  shard_ = strategy.shard();
  GEOLOCO_CHECK(shard_ == peers_.layout().shard(site, rank),
                "site {} rank {}: shard [{}, {}) but the exchange "
                "layout has [{}, {})",
                site, rank, shard_.offset, shard_.end(), peers_.layout().shard(site, rank).offset,
                peers_.layout().shard(site, rank).end());
  // Every site starts from the same initial weights (same seed): check it before training.
  if (transport && !joining) {
    std::vector<PieceHash> hs;
    for (uint32_t pi : peers_.layout().pieces_of(site, rank)) {
      const Piece& p = peers_.layout().pieces()[pi];
      hs.push_back(
          {pi, hash64(shard.data() + (p.begin - shard_.offset), static_cast<size_t>(p.size()) * sizeof(float))});
    }
    HashCheck c = post_hash_check(peers_, hs, 0);
    verify_hash_check(peers_, cfg_, c);
  }
  // outer.quantize_on: a GPU site quantizes its rounds on the device (a capture of the
  // pseudo-gradients for bench/compression needs them on the host: the host path then).
  gpu_site_ = strategy.device_outer() != nullptr;
  if (ocfg_.quantize_on != "host" && transport) {
    device_ = strategy.device_outer();
    if (device_ && !hooks_.capture_dir.empty()) {
      if (rank_ == 0)
        spdlog::info("site {}: pseudo-gradients are captured on the host: quantized there this run",
                     cfg.sites[static_cast<size_t>(site)].name);
      device_ = nullptr;
    }
  }
  build_fragments(ocfg_.fragments, shard);
  site_hash_ = combine_site_hash(strategy, piece_hashes());
  // The config's own schedule is plan epoch 0.
  plan_.interval = interval_;
  plan_.fragments = ocfg_.fragments;
  plan_.codec = std::string(compression::codec_name(pcfg_.codec));
  plan_.lanes = transport ? transport->lanes() : 1;
  plan_.reason = "the configured schedule (outer.plan: manual)";
  planned_ = !ocfg_.auto_plan() || S == 1;
  if (planned_) prefault_round_buffers();  // (under plan: auto, the plan's fragments are)
  if (ocfg_.auto_plan() && S == 1 && rank_ == 0)
    spdlog::warn("outer.plan: auto needs more than one site; keeping the configured schedule");
  if (rank_ == 0 && plans_.size() > 1)
    for (const auto& p : plans_) spdlog::info("outer loop: {}", p.describe());
}

Diloco::~Diloco() {
  // A run that failed with syncs in flight or a probe running: what they still wait for is
  // cancelled (the operations own their buffers), so the joins are prompt.
  // (After a run that ended well nothing is pending and this cancels nothing.)
  membership_.stop();
  donors_.clear();  // stops serving joiners
  try {
    peers_.cancel_all("the outer loop is stopping");
  } catch (const std::exception& e) {
    spdlog::debug("outer loop: cancel at shutdown: {}", e.what());
  }
  for (auto& f : frags_) {
    if (f->worker.joinable()) f->worker.join();
    if (f->agreer.joinable()) f->agreer.join();
  }
}

void Diloco::build_fragments(int fragments, std::span<const float> shard) {
  for (const auto& f : frags_)
    GEOLOCO_CHECK(!f->check, "fragments rebuilt with a hash check of round {} unverified", f->check->round);
  plans_ = plan_fragments(layout_, fragments, interval_);
  frags_.clear();
  if (device_) device_->clear();
  for (const auto& plan : plans_) {
    auto f = std::make_unique<Fragment>();
    f->index = plan.index;
    f->local = intersect(plan.ranges, shard_);
    for (const auto& r : f->local) f->n += static_cast<size_t>(r.size());
    f->global.resize(f->n);
    gather_local(*f, shard, f->global);
    f->pipeline = std::make_unique<compression::Pipeline>(pcfg_);
    if (pcfg_.error_feedback) f->ef = std::make_unique<compression::ErrorFeedback>(f->n);
    f->opt = std::make_unique<OuterOptimizer>(ocfg_.optimizer, f->n);
    f->hash = hash64(f->global.data(), f->global.size() * sizeof(float));
    f->segments = cut_segments(f->local, shard_, peers_.layout(), site_, rank_);
    // (after the segments: it holds the elements of this site's slices of them)
    if (pcfg_.error_feedback && ctx_.owner)
      f->owner_ef = std::make_unique<compression::ErrorFeedback>(owned_count(*f, site_, peers_.sites()));
    f->segment_hash = segment_hashes(f->segments, f->global);
    f->on_device = device_ && device_quantizable(pcfg_);
    if (f->on_device) define_on_device(*f);
    frags_.push_back(std::move(f));
  }
}

void Diloco::define_on_device(const Fragment& f) const {
  std::vector<trainer::DeviceRun> runs;
  for (const auto& r : f.local) runs.push_back({r.begin, r.end});
  device_->define(f.index, runs, f.global, f.ef ? std::span<const float>(f.ef->residual()) : std::span<const float>());
}

void Diloco::residuals_to_host() const {
  for (const auto& f : frags_)
    if (f->on_device && f->ef) device_->residual(f->index, f->ef->residual());
}

void Diloco::snapshot(Fragment& f, trainer::SiteStrategy& strategy, bool quantize) {
  begin_round_buffers(f);
  snapshot_fp32_bytes_ += f.n * sizeof(float);
  if (!f.on_device || !quantize) {
    f.delta.resize(f.n);
    gather_local(f, strategy.shard_params(), f.delta);  // the pseudo-gradient is computed in place
    snapshot_host_bytes_ += f.n * sizeof(float);
    return;
  }
  trainer::TraceSpan sp(ctx_.trace, "device_quantize", trainer::TraceRecorder::kMainThread);
  std::vector<trainer::DeviceSlice> slices;
  for (const Slice& sl : round_slices(f, ctx_.owner, peers_.sites())) slices.push_back({sl.begin, sl.end});
  f.staged =
      device_->quantize(f.index, pcfg_.codec, pcfg_.block, static_cast<float>(pcfg_.error_feedback_decay), slices);
  snapshot_host_bytes_ += f.staged->host_bytes;
}

void Diloco::merge_global(Fragment& f, trainer::SiteStrategy& strategy, float alpha) {
  if (f.on_device) {
    device_->merge(f.index, f.global, alpha);
    return;
  }
  auto shard = strategy.shard_params();
  if (alpha < 0) {
    scatter_local(f, f.global, shard);
  } else {
    // Elementwise and contraction-free: bit-identical on every rank that holds the same local
    // values (and to the device's merge).
    const float a = alpha, b = 1.0f - a;
    size_t k = 0;
    for (const auto& rg : f.local)
      for (int64_t i = rg.begin; i < rg.end; ++i, ++k) {
        float& x = shard[static_cast<size_t>(i)];
        x = a * x + b * f.global[k];
      }
  }
  strategy.shard_updated();
}

bool Diloco::overlapped() const { return ocfg_.overlapped(); }

int64_t Diloco::tau() const { return ocfg_.delayed_update ? interval_ : ocfg_.overlap_steps; }

int Diloco::trace_tid(const Fragment& f) const {
  return f.index == 0 ? trainer::TraceRecorder::kOuterThread : trainer::TraceRecorder::kFragmentThreadBase + f.index;
}

// The fragment's values, gathered from the shard in range order.
void Diloco::gather_local(const Fragment& f, std::span<const float> shard, std::span<float> out) const {
  size_t k = 0;
  for (const auto& r : f.local) {
    std::copy(shard.begin() + r.begin, shard.begin() + r.end, out.begin() + static_cast<std::ptrdiff_t>(k));
    k += static_cast<size_t>(r.size());
  }
}

void Diloco::scatter_local(const Fragment& f, std::span<const float> gathered, std::span<float> shard) const {
  size_t k = 0;
  for (const auto& r : f.local) {
    std::copy_n(gathered.begin() + static_cast<std::ptrdiff_t>(k), r.size(), shard.begin() + r.begin);
    k += static_cast<size_t>(r.size());
  }
}

void Diloco::restore_owner_residual(Fragment& f, std::span<const float> shard) const {
  std::vector<float> gathered(f.n);
  gather_local(f, shard, gathered);
  gather_owned(f, site_, peers_.sites(), gathered, f.owner_ef->residual());
}

std::vector<float> Diloco::pack_owner_residual() const {
  std::vector<float> out(n_, 0.0f), gathered;
  for (const auto& f : frags_) {
    gathered.assign(f->n, 0.0f);
    expand_owned(*f, site_, peers_.sites(), f->owner_ef->residual(), gathered);
    scatter_local(*f, gathered, out);
  }
  return out;
}

Diloco::ShardState Diloco::pack_state() const {
  residuals_to_host();
  // Each fragment's vectors scattered back to where their elements sit in the shard.
  auto pack = [&](auto get) {
    std::vector<float> out(n_, 0.0f);
    for (const auto& f : frags_) scatter_local(*f, get(*f), out);
    return out;
  };
  ShardState st;
  st.global = pack([](const Fragment& f) { return std::span<const float>(f.global); });
  if (!frags_[0]->opt->state_a().empty())
    st.opt_a = pack([](const Fragment& f) { return std::span<const float>(f.opt->state_a()); });
  if (!frags_[0]->opt->state_b().empty())
    st.opt_b = pack([](const Fragment& f) { return std::span<const float>(f.opt->state_b()); });
  if (frags_[0]->ef) st.ef = pack([](const Fragment& f) { return std::span<const float>(f.ef->residual()); });
  if (frags_[0]->owner_ef) st.owner_ef = pack_owner_residual();
  return st;
}

void Diloco::unpack_state(const ShardState& st) {
  for (auto& f : frags_) {
    gather_local(*f, st.global, f->global);
    if (!st.opt_a.empty()) gather_local(*f, st.opt_a, f->opt->state_a());
    if (!st.opt_b.empty()) gather_local(*f, st.opt_b, f->opt->state_b());
    if (!st.ef.empty() && f->ef) gather_local(*f, st.ef, f->ef->residual());
    if (!st.owner_ef.empty() && f->owner_ef) restore_owner_residual(*f, st.owner_ef);
    f->hash = hash64(f->global.data(), f->global.size() * sizeof(float));
    f->segment_hash = segment_hashes(f->segments, f->global);
    if (f->on_device) define_on_device(*f);
  }
}

void Diloco::set_schedule(const PlanDecision& d, std::span<const float> global) {
  verify_pending_checks();
  interval_ = d.interval;
  pcfg_ = plan_compression(ocfg_.compression, d);
  if (ocfg_.exchange_auto()) ctx_.owner = d.exchange == "owner" && peers_.sites() > 1;
  if (auto* t = peers_.transport()) t->set_active_lanes(std::min(d.lanes, t->lanes()));
  buffer_pool_.clear();
  build_fragments(d.fragments, global);
  prefault_round_buffers();
}

std::vector<uint64_t> Diloco::piece_hashes() const {
  // By piece of this shard: with one fragment, its segment's hash (the whole shard's when the
  // sites have one rank count); with several, a hash of the fragments' hashes of it.
  std::vector<uint64_t> out;
  const size_t K = frags_.front()->segments.size();
  for (size_t k = 0; k < K; ++k) {
    if (frags_.size() == 1) {
      out.push_back(frags_[0]->segment_hash.at(k));
      continue;
    }
    Hasher hs;
    for (const auto& f : frags_) hs.update(&f->segment_hash.at(k), sizeof(uint64_t));
    out.push_back(hs.digest());
  }
  return out;
}

bool Diloco::after_inner_step(int64_t step, trainer::SiteStrategy& strategy) {
  step_ = step;
  bool synced = schedule_step(step, strategy);
  if (overlapped() && cfg_.train.checkpoint_every > 0 && step % cfg_.train.checkpoint_every == 0) {
    decide_in_flight(strategy);
    synced = true;
  }
  // Sites a round of this step took in get the state once everything of the step is done.
  if (admitted_) {
    serve_admitted(step, strategy);
    return true;
  }
  return synced;
}

bool Diloco::trains_step(int64_t step) {
  if (!ocfg_.pace_by_time() || !planned_ || peers_.sites() < 2) return true;
  const bool trains = pace_.trains(step, epoch_start_, interval_);
  if (!trains) skipped_step_ = step;
  return trains;
}

bool Diloco::schedule_step(int64_t step, trainer::SiteStrategy& strategy) {
  // Inner step time: from the end of the previous call to the start of this one (a step
  // outer.pace: time skipped took none: not a sample).
  const auto now = Clock::now();
  const bool trained = skipped_step_ != step;
  if (trained) ++trained_steps_;
  if (last_hook_end_ == Clock::time_point{}) {
    first_step_ = step - 1;  // the step this run (segment) started from
  } else if (trained) {
    const double dt = std::chrono::duration<double>(now - last_hook_end_).count();
    step_times_.push_back(dt);
    pace_.sample(dt);
  }
  struct Stamp {
    Clock::time_point& t;
    ~Stamp() { t = Clock::now(); }
  } stamp{last_hook_end_};

  bool any = false;
  // Merges first: with delayed_update the merge of round t and the launch of round t+1 of
  // a fragment fall on the same step.
  {
    const MergesRunning merging{in_merges_, true};
    for (auto& f : frags_)
      if (f->pending_merge && step >= f->merge_step) {
        complete(*f, strategy);
        any = true;
      }
  }
  return after_merges(step, strategy, any);
}

void Diloco::decide_in_flight(trainer::SiteStrategy& strategy) {
  for (auto& f : frags_) {
    join_worker(*f);
    if (f->awaiting_decision) f->result = decide_or_keep(*f, strategy);
  }
}

ExchangeResult Diloco::decide_or_keep(Fragment& f, trainer::SiteStrategy& strategy) {
  try {
    return decide_and_apply(f, trace_tid(f), strategy);
  } catch (const QuorumLost&) {
    // Nothing of this round or of the rounds still in flight is applied: a checkpoint of
    // them lets --resume exchange them all again (resumed()), as if the wait had been longer.
    retries_ = undecided_rounds(f);
    retry_rest_ = in_merges_;
    throw;
  }
}

bool Diloco::after_merges(int64_t step, trainer::SiteStrategy& strategy, bool any) {
  for (auto& f : frags_)
    if (f->awaiting_decision && !f->voted && step >= f->vote_step && step < f->merge_step)
      vote(*f, strategy, /*background=*/true);
  if (step == cfg_.train.steps) {
    // The last step: blocking syncs, so that every site ends with the same weights.
    final_sync(step, strategy);
    return true;
  }
  if (!planned_) {
    // outer.plan: auto times the first steps; nothing syncs before the plan. Rank 0 probes
    // the other sites in the background meanwhile (started here, not at construction, so a
    // run resumed with its plan restored never probes); joined at the plan.
    planner_.start_probe();
    if (step >= first_step_ + ocfg_.plan_measure_steps)
      apply_plan(planner_.initial(strategy, step_times_), step, strategy, true);
    return any;
  }
  const int64_t rel = step - epoch_start_;
  if (ocfg_.auto_plan() && cfg_.sites.size() > 1 && rel > 0 && rel % interval_ == 0) {
    auto next = planner_.boundary(step, rel / interval_, strategy, plan_, boundary_syncs_, step_times_);
    boundary_syncs_.clear();
    step_times_.clear();
    if (next) {
      apply_plan(*next, step, strategy, false);
      return true;
    }
  }
  for (auto& f : frags_) {
    if (!syncs_at(plans_[static_cast<size_t>(f->index)], rel, interval_)) continue;
    if (overlapped())
      launch(*f, step, strategy);
    else
      sync(*f, step, strategy);
    any = any || !overlapped();
  }
  return any;
}

void Diloco::finish(int64_t step, trainer::SiteStrategy& strategy) {
  final_sync(step, strategy);
  serve_admitted(step, strategy);
  if (rank_ != 0) return;
  const nlohmann::json t = tokens_json();
  const uint64_t lost = t["not_committed"].get<uint64_t>();
  spdlog::info("site {}: trained {} tokens{}, {} in committed rounds{}", t["site"].get<std::string>(),
               t["trained"].get<uint64_t>(),
               tokens_first_round_ > 0 ? fmt::format(" after outer round {}", tokens_first_round_) : std::string(),
               t["committed"].get<uint64_t>(),
               lost ? fmt::format(", {} not committed (rounds it was left out of)", lost) : std::string());
}

void Diloco::final_sync(int64_t step, trainer::SiteStrategy& strategy) {
  for (auto& f : frags_)
    if (f->pending_merge) complete(*f, strategy);
  for (auto& f : frags_)
    if (f->blocking_step != step) sync(*f, step, strategy);
  // Every site ends with the same weights, verified (the run's one blocking check).
  verify_pending_checks();
}

void Diloco::apply_plan(const PlanDecision& d, int64_t step, trainer::SiteStrategy& strategy, bool initial) {
  if (!initial) {
    // Land everything under the old schedule: merges, then a blocking sync of every fragment.
    for (auto& f : frags_)
      if (f->pending_merge) complete(*f, strategy);
    for (auto& f : frags_)
      if (f->blocking_step != step) sync(*f, step, strategy);
  }
  // Carry the global weights, outer-optimizer state and error feedback across the new cut.
  const ShardState st = pack_state();
  int64_t opt_steps = 0;
  for (auto& f : frags_) opt_steps = std::max(opt_steps, f->opt->steps());
  set_schedule(d, st.global);
  unpack_state(st);
  for (auto& f : frags_) {
    f->opt->set_steps(opt_steps);
    f->last_sync_step = initial ? 0 : step;
    f->last_sync_trained = initial ? 0 : trained_steps_;
    f->blocking_step = initial ? -1 : step;
  }
  epoch_start_ = step;
  plan_ = d;
  plan_history_.push_back(d);
  planned_ = true;
  planner_.restart();
  step_times_.clear();
  boundary_syncs_.clear();
  site_hash_ = combine_site_hash(strategy, piece_hashes());
  log_plan(d, step);
}

void Diloco::log_plan(const PlanDecision& d, int64_t step) const {
  if (rank_ != 0) return;
  spdlog::info(
      "outer plan (epoch {}, from step {}): H {}, {} fragment(s), {}, {} lane(s); predicted utilization {:.4f}. {}",
      d.epoch, step, d.interval, d.fragments, d.codec, d.lanes, d.predicted_utilization, d.reason);
  // plan.json: written by the lowest-index site still in the run (site 0 unless it was lost).
  if (const SiteMask m = membership_.members(); m ? std::countr_zero(m) != site_ : site_ != 0) return;
  nlohmann::json all = nlohmann::json::array();
  for (const auto& p : plan_history_) all.push_back(p.to_json());
  std::error_code ec;
  std::filesystem::create_directories(cfg_.run.output_dir, ec);
  trainer::write_text_atomically(
      (std::filesystem::path(cfg_.run.output_dir) / "plan.json").string(),
      nlohmann::json({{"format", "geoloco-plan"}, {"version", 1}, {"plans", all}}).dump(2) + "\n");
}

namespace {
// The site's one value of a per-rank integer some ranks may lack: the floor of the mean over
// the ranks that have one (integers summed as doubles: exact, so the same on every rank);
// none when no rank has one.
std::optional<uint32_t> site_agreed(trainer::SiteStrategy& strategy, std::optional<uint32_t> mine) {
  std::array<double, 2> v{mine ? double(*mine) : 0.0, mine ? 1.0 : 0.0};
  strategy.site_sum(v);
  if (v[1] <= 0) return std::nullopt;
  return static_cast<uint32_t>(std::llround(std::floor(v[0] / v[1])));
}
}  // namespace

uint32_t Diloco::agreed_step_us(trainer::SiteStrategy& strategy) {
  // The site's mean of its ranks' medians (ranks with no sample yet count for none).
  const uint32_t mine = pace_.take_step_us();
  return site_agreed(strategy, mine > 0 ? std::optional<uint32_t>(mine) : std::nullopt).value_or(0);
}

void Diloco::decide_pace(trainer::SiteStrategy& strategy, uint64_t round, int64_t step, const ExchangeResult& r) {
  // Every rank holding a contribution computes the same ratio from the same reports; a rank
  // with no segment holds none and takes its site's.
  const auto agreed = site_agreed(strategy, Pace::ratio_from(r.step_us, site_, ocfg_.pace_tolerance));
  if (!agreed) return;
  const uint32_t ratio = *agreed;
  if (Pace::duty(ratio, interval_) != Pace::duty(pace_.next_ppm(), interval_)) {
    pace_history_.push_back({{"round", round}, {"step", step}, {"ratio", double(ratio) / Pace::kWhole}});
    if (rank_ == 0)
      spdlog::info(
          "site {}: outer.pace: time: trains {} of every {} inner steps from the next period "
          "(step times by site, us: {})",
          cfg_.sites[static_cast<size_t>(site_)].name, Pace::duty(ratio, interval_), interval_,
          fmt::join(r.step_us, ", "));
  }
  pace_.decide(ratio);
}

nlohmann::json Diloco::pace_json() const {
  return {{"ratio", double(pace_.next_ppm()) / Pace::kWhole},
          {"trains_of_interval", Pace::duty(pace_.next_ppm(), interval_)}};
}

uint64_t Diloco::round_tokens(Fragment& f, int64_t step, trainer::SiteStrategy& strategy) {
  if (!ocfg_.pace_by_time()) return tokens_since(step, f.last_sync_step);
  f.step_us = agreed_step_us(strategy);
  const int64_t trained = std::max<int64_t>(0, trained_steps_ - f.last_sync_trained);
  f.last_sync_trained = trained_steps_;
  return tokens_since(trained, 0);
}

uint64_t Diloco::tokens_since(int64_t step, int64_t since) const {
  return static_cast<uint64_t>(step - since) * static_cast<uint64_t>(cfg_.site_batch(site_)) *
         static_cast<uint64_t>(cfg_.seq_len());
}

void Diloco::sync(Fragment& f, int64_t step, trainer::SiteStrategy& strategy, const Retry* again) {
  const auto t0 = Clock::now();
  const uint64_t round = static_cast<uint64_t>(++round_);
  // `again`: sent as made before (not quantized again: the residual already holds its
  // error); the round's error figures against the shard's values.
  snapshot(f, strategy, /*quantize=*/!again);
  f.attachment = planned_ ? planner_.attachment() : std::vector<uint8_t>{};
  const uint64_t tokens = round_tokens(f, step, strategy);
  collect_round(f, ctx_, step, round, tokens, f.delta, membership_.active(round), membership_.deadline_s(),
                trainer::TraceRecorder::kMainThread, again ? &again->mine : nullptr);
  ExchangeResult r;
  try {
    r = decide_and_apply(f, trainer::TraceRecorder::kMainThread, strategy);
  } catch (const QuorumLost&) {
    // Nothing of the round is applied: the state is the last committed one, plus this
    // rank's contribution (and its encoding error in the residual). A checkpoint of it lets
    // --resume exchange this round again, as if the wait had been longer.
    // (With overlap a blocking round is the last step's or a re-plan's: only the last step's
    // is kept, the others resume from the last periodic checkpoint.)
    if (!overlapped() || step == cfg_.train.steps)
      retries_ = {Retry{f.index, round, step, step, OwnContribution{f.inbox.mine, f.inbox.infos}}};
    throw;
  }
  f.last_sync_step = step;
  f.blocking_step = step;

  // 5. local <- global; the site re-assembles its replica.
  {
    trainer::TraceSpan sp(ctx_.trace, "outer_step", trainer::TraceRecorder::kMainThread);
    merge_global(f, strategy, -1.0f);
    if (ocfg_.inner_state == "reset") strategy.optimizer().reset();
  }
  finish_round(f, strategy, step, round, std::chrono::duration<double>(Clock::now() - t0).count(), r);
}

void Diloco::launch(Fragment& f, int64_t step, trainer::SiteStrategy& strategy) {
  const uint64_t round = static_cast<uint64_t>(++round_);
  const uint64_t tokens = round_tokens(f, step, strategy);
  // The worker reads a snapshot (f.delta, turned into the pseudo-gradient in place): the inner
  // loop keeps training the live shard meanwhile.
  snapshot(f, strategy);
  f.attachment = planned_ ? planner_.attachment() : std::vector<uint8_t>{};
  f.last_sync_step = step;
  f.launch_step = step;
  f.round = round;
  f.merge_step = step + tau();
  // The site votes on the round's membership halfway to the merge, so the consensus with
  // the other sites runs behind the remaining steps (tau 1: at the merge).
  f.vote_step = tau() >= 2 ? step + (tau() + 1) / 2 : f.merge_step;
  f.voted = false;
  f.awaiting_decision = true;
  f.pending_merge = true;
  launch_worker(f, ctx_, step, round, tokens, membership_.active(round), membership_.deadline_s(), trace_tid(f));
}

void Diloco::vote(Fragment& f, trainer::SiteStrategy& strategy, bool background) {
  join_worker(f);  // the collection
  const RoundInbox& in = f.inbox;
  membership_.record_wait(in.wait_s);
  trainer::TraceSpan sp(ctx_.trace, "membership_vote", trainer::TraceRecorder::kMainThread);
  const auto t0 = Clock::now();
  try {
    if (split_possible()) check_split(in.round, in.step, strategy);
    f.site_holds = membership_.vote_site(in.round, in.holds, poll_join_requests(in.round), strategy);
  } catch (Error& e) {
    e.add_context(fmt::format("outer step {} (inner step {})", in.round, in.step));
    throw;
  }
  f.voted = true;
  f.verdict.clear();
  if (rank_ == 0) {
    const uint64_t round = in.round;
    const SiteMask holds = f.site_holds, expected = membership_.active(round), in_run = membership_.members();
    if (background) {
      Fragment* fp = &f;
      const RoundMembership* m = &membership_;
      f.agreer = std::thread(
          [fp, m, round, holds, expected, in_run] { fp->verdict = m->agree(round, holds, expected, in_run); });
    } else {
      f.verdict = membership_.agree(round, holds, expected, in_run);
    }
  }
  f.vote_s = std::chrono::duration<double>(Clock::now() - t0).count();
}

ExchangeResult Diloco::decide_and_apply(Fragment& f, int tid, trainer::SiteStrategy& strategy) {
  if (!f.voted) vote(f, strategy, /*background=*/false);
  const RoundInbox& in = f.inbox;
  SiteMask members = 0;
  double exposed = f.vote_s;
  const SiteMask before = membership_.active(in.round);
  {
    trainer::TraceSpan sp(ctx_.trace, "membership", tid);
    const auto t0 = Clock::now();
    if (f.agreer.joinable()) f.agreer.join();
    try {
      try {
        members = membership_.share(in.round, in.step, f.site_holds, std::move(f.verdict), in.missing, strategy);
      } catch (const SiteLeftOut&) {
        // Left out after a partition healed: the other side's split status arrived before the
        // decision that left this site out; its heal rule (which side is kept, the tokens
        // discarded) says more than "left out", so it speaks if it applies (every rank here).
        if (split_possible()) check_split(in.round, in.step, strategy);
        throw;
      }
    } catch (Error& e) {
      e.add_context(fmt::format("outer step {} (inner step {})", in.round, in.step));
      f.voted = false;
      throw;
    }
    exposed += std::chrono::duration<double>(Clock::now() - t0).count();
  }
  f.voted = false;
  f.awaiting_decision = false;
  const SiteMask joiners = members & ~before;
  for (int s = 0; s < static_cast<int>(join_watch_.size()); ++s)
    if ((joiners >> s) & 1)
      for (auto& w : join_watch_[static_cast<size_t>(s)]) w.requested = false;
  admitted_ |= joiners;  // served the state at the end of the step (serve_admitted)
  ExchangeResult r = apply_round(f, ctx_, members, joiners, tid);
  r.membership_s = exposed;
  // outer.plan: auto: the members' reports and decisions this round carried (plan_coordinator.hpp).
  if (ocfg_.auto_plan() && planned_) planner_.committed(in.round, r.attachments, members & ~joiners, plan_);
  f.inbox = RoundInbox{};  // applied: nothing left to decide
  return r;
}

std::vector<Diloco::Retry> Diloco::undecided_rounds(Fragment& failed) {
  std::vector<Retry> out;
  for (auto& f : frags_) {
    if (f.get() != &failed) {
      if (!f->awaiting_decision) continue;
      join_worker(*f);  // its exchange ends by its deadline
    }
    out.push_back(
        Retry{f->index, f->round, f->launch_step, f->merge_step, OwnContribution{f->inbox.mine, f->inbox.infos}});
  }
  std::sort(out.begin(), out.end(), [](const Retry& a, const Retry& b) { return a.round < b.round; });
  return out;
}

void Diloco::complete(Fragment& f, trainer::SiteStrategy& strategy) {
  join_worker(f);
  // A restored checkpoint's pending merge has its round applied already (no inbox).
  if (f.awaiting_decision) f.result = decide_or_keep(f, strategy);
  // local <- alpha * local + (1 - alpha) * global: keeps part of the inner progress made
  // while the sync was in flight. Elementwise and contraction-free: bit-identical on every
  // rank that holds the same local values.
  {
    trainer::TraceSpan sp(ctx_.trace, "merge", trainer::TraceRecorder::kMainThread);
    merge_global(f, strategy, static_cast<float>(ocfg_.merge_alpha));
    if (ocfg_.inner_state == "reset") strategy.optimizer().reset();
  }
  f.pending_merge = false;
  // A restored checkpoint has no worker timing: count the round with its joined time only.
  const double secs = f.joined ? f.joined_seconds : 0.0;
  f.joined = false;
  finish_round(f, strategy, f.launch_step, f.round, secs, f.result);
}

void Diloco::begin_round_buffers(Fragment& f) {
  if (f.delta.capacity() < f.n && !buffer_pool_.empty()) {
    RoundBuffers& pooled = buffer_pool_.back();
    f.delta.swap(pooled.delta);
    f.decoded.swap(pooled.decoded);
    f.avg.swap(pooled.avg);
    buffer_pool_.pop_back();
  }
  f.delta.resize(f.on_device ? 0 : f.n);  // (quantized on the device: no host pseudo-gradient)
  f.decoded.resize(f.n);
  f.avg.resize(f.n);
  uint64_t held = 0;
  for (const auto& g : frags_) held += g->delta.capacity() + g->decoded.capacity() + g->avg.capacity();
  for (const auto& p : buffer_pool_) held += p.delta.capacity() + p.decoded.capacity() + p.avg.capacity();
  round_buffer_peak_ = std::max(round_buffer_peak_, held * sizeof(float));
}

void Diloco::end_round_buffers(Fragment& f) {
  // With one fragment the next round needs them all again: keep them. With several, only the
  // fragments in flight hold theirs; the others' go back to the pool for the next round.
  if (frags_.size() <= 1) return;
  RoundBuffers done;
  done.delta.swap(f.delta);
  done.decoded.swap(f.decoded);
  done.avg.swap(f.avg);
  buffer_pool_.push_back(std::move(done));
}

void Diloco::prefault_round_buffers() {
  size_t most = 0;
  for (auto& f : frags_) {
    most = std::max(most, f->n);
    f->pipeline->reserve(f->n);
  }
  if (frags_.size() == 1) {
    begin_round_buffers(*frags_[0]);
  } else if (buffer_pool_.empty() && most > 0) {
    RoundBuffers first;
    if (!frags_[0]->on_device) first.delta.resize(most);
    first.decoded.resize(most);
    first.avg.resize(most);
    buffer_pool_.push_back(std::move(first));
  }
}

void Diloco::finish_round(Fragment& f, trainer::SiteStrategy& strategy, int64_t step, uint64_t round, double seconds,
                          const ExchangeResult& r) {
  end_round_buffers(f);
  f.hash = r.hash;
  f.segment_hash = r.segment_hash;
  site_hash_ = combine_site_hash(strategy, piece_hashes());
  last_sync_s_ = seconds;
  sync_seconds_.push_back(last_sync_s_);
  // outer.plan: auto's drift test: a fragment's first round since it was built pays its
  // first-touch costs (buffers, transport registration): not what the next ones will take.
  if (f.rounds_done++ > 0) boundary_syncs_.push_back(seconds);
  frame_bytes_total_ += r.frame_bytes;
  elements_total_ += r.elements;
  if (!r.tokens.empty()) {
    uint64_t all = 0;
    for (const auto& p : plans_) all += static_cast<uint64_t>(p.elements());
    const double share =
        all > 0 ? double(plans_[static_cast<size_t>(f.index)].elements()) / double(all) : 1.0 / double(frags_.size());
    for (size_t s = 0; s < r.tokens.size() && s < committed_tokens_.size(); ++s)
      committed_tokens_[s] += share * double(r.tokens[s]);
  }
  if (ocfg_.pace_by_time()) decide_pace(strategy, round, step, r);
  record_round(f, step, round, seconds, r);
  if (rank_ == 0) {
    const std::string frag = frags_.size() > 1 ? fmt::format(" fragment {}/{}", f.index, frags_.size()) : "";
    spdlog::info(
        "outer step {}{} at inner step {}: sync {:.3f} s, {} bytes/rank/peer (x{:.1f} vs fp32), global weights {}",
        round, frag, step, last_sync_s_, r.envelope_bytes, r.ratio, hex64(site_hash_));
  }
}

void Diloco::verify_pending_checks() {
  for (auto& f : frags_) {
    if (!f->check || f->in_flight) continue;  // in flight: the worker verifies it
    trainer::TraceSpan sp(ctx_.trace, "hash_check", trainer::TraceRecorder::kMainThread);
    // When the run outlives a site, a member lost since the round is no divergence (it is out
    // of the next round, or the run ended); with every site needed, its loss is an error.
    verify_hash_check(peers_, cfg_, *f->check, membership_.quorum() < peers_.sites());
    f->check.reset();
  }
}

uint64_t Diloco::combine_site_hash(trainer::SiteStrategy& strategy, const std::vector<uint64_t>& pieces) {
  // The pieces' hashes in piece order (the ranks' in rank order): the same list, so the same
  // hash, at every site whatever its rank count.
  const auto bytes = std::as_bytes(std::span<const uint64_t>(pieces));
  auto* coll = strategy.collective();
  if (!coll || strategy.ranks() == 1) return hash64(bytes.data(), bytes.size());
  auto all = coll->all_gather_bytes(bytes);
  Hasher hs;
  for (auto& b : all) hs.update(b.data(), b.size());
  return hs.digest();
}

nlohmann::json Diloco::metrics() {
  nlohmann::json j;
  j["outer_step"] = round_;
  j["sync_s"] = last_sync_s_;
  j["global_hash"] = hex64(site_hash_);
  if (auto* t = peers_.transport()) {
    uint64_t sent = 0;
    for (auto& p : t->stats().peers) sent += p.bytes_sent;
    j["wan_bytes_sent"] = sent;
  }
  return j;
}

void Diloco::record_round(const Fragment& f, int64_t step, uint64_t round, double seconds, const ExchangeResult& r) {
  nlohmann::json j = {{"round", round},
                      {"fragment", f.index},
                      {"step", step},
                      {"sync_s", seconds},
                      {"bytes_per_peer", r.envelope_bytes},
                      {"sent_bytes", r.sent_bytes},
                      {"frame_bytes", r.frame_bytes},
                      {"elements", r.elements},
                      {"compression_ratio", r.ratio},
                      {"err2", r.err2},
                      {"ref2", r.ref2},
                      {"plan_epoch", plan_.epoch},
                      {"members", member_names(r.members)},
                      {"joiners", member_names(r.joiners)},
                      {"wait_s", r.wait_s},
                      {"membership_s", r.membership_s},
                      {"tokens", r.tokens},
                      {"global_hash", hex64(site_hash_)}};
  if (ocfg_.pace_by_time()) {
    j["pace"] = pace_json();
    j["pace"]["step_us"] = r.step_us;
  }
  if (plan_.predicted_fragment_sync_s > 0) j["predicted_sync_s"] = plan_.predicted_fragment_sync_s;
  if (auto* t = peers_.transport()) {
    nlohmann::json peers = nlohmann::json::array();
    for (const auto& p : t->stats().peers)
      peers.push_back({{"site", p.site},
                       {"rank", p.rank},
                       {"bytes_sent", p.bytes_sent},
                       {"bytes_received", p.bytes_received},
                       {"lane_bytes_sent", p.lane_bytes_sent}});
    j["peers"] = std::move(peers);
  }
  round_records_.push_back(std::move(j));
}

std::vector<nlohmann::json> Diloco::take_rounds() { return std::exchange(round_records_, {}); }

nlohmann::json Diloco::summary() {
  nlohmann::json j;
  j["outer_steps"] = round_;
  j["outer_interval"] = interval_;
  j["outer_fragments"] = frags_.size();
  j["outer_overlap_steps"] = tau();
  j["outer_delayed_update"] = ocfg_.delayed_update;
  j["outer_optimizer"] = ocfg_.optimizer.kind;
  j["compression"] = pcfg_.describe();
  j["outer_plan"] = ocfg_.plan;
  if (ocfg_.auto_plan()) {
    nlohmann::json plans = nlohmann::json::array();
    for (const auto& p : plan_history_) plans.push_back(p.to_json());
    j["plans"] = plans;
    j["replans"] = planner_.replans();
    j["plan_recalibrations"] = planner_.recalibrations();
  }
  j["outer_pace"] = ocfg_.pace;
  j["outer_exchange"] = ctx_.owner ? "owner" : "all_to_all";  // in force at the end (exchange: auto: the plan's)
  if (ocfg_.pace_by_time()) {
    j["pace"] = pace_json();
    j["pace"]["trained_steps"] = trained_steps_;
    j["pace"]["decisions"] = pace_history_;
  }
  j["sync_seconds"] = sync_seconds_;
  j["sync_seconds_mean"] = sync_seconds_.empty() ? 0.0
                                                 : std::accumulate(sync_seconds_.begin(), sync_seconds_.end(), 0.0) /
                                                       double(sync_seconds_.size());
  // Per period of `interval` steps: F fragment rounds together carry one model's worth.
  const double periods = double(round_) / double(frags_.size());
  j["wire_bytes_per_outer_step"] = periods > 0 ? double(frame_bytes_total_) / periods : 0.0;
  j["compression_ratio"] = frame_bytes_total_ ? 4.0 * double(elements_total_) / double(frame_bytes_total_) : 0.0;
  nlohmann::json fr = nlohmann::json::array();
  for (size_t i = 0; i < plans_.size(); ++i)
    fr.push_back({{"index", plans_[i].index},
                  {"offset", plans_[i].offset},
                  {"blocks", plans_[i].blocks},
                  {"params", plans_[i].elements()},
                  {"shard_elements", frags_[i]->n}});
  j["fragments"] = fr;
  uint64_t sent = 0, recv = 0;
  if (auto* t = peers_.transport()) {
    auto st = t->stats();
    for (auto& p : st.peers) {
      sent += p.bytes_sent;
      recv += p.bytes_received;
    }
    j["transport"] = st.to_json();
  }
  j["wan_bytes_sent"] = sent;
  j["wan_bytes_received"] = recv;
  j["global_weights_hash"] = hex64(site_hash_);
  j["outer_memory"] = memory_json();
  if (gpu_site_) {
    // What the rounds' snapshots copied from the device: scales and codes (quantized there),
    // or the fp32 shard part; and what fp32 staging copies for the same rounds.
    j["outer_quantize_on"] = frags_[0]->on_device ? "device" : "host";
    j["snapshot_host_bytes"] = snapshot_host_bytes_;
    j["snapshot_fp32_bytes"] = snapshot_fp32_bytes_;
  }
  nlohmann::json ev = nlohmann::json::array();
  for (const auto& e : membership_.evictions())
    ev.push_back(
        {{"round", e.round}, {"step", e.step}, {"site", cfg_.sites[static_cast<size_t>(e.site)].name}, {"why", e.why}});
  j["membership"] = {{"min_sites", membership_.quorum()},
                     {"members", member_names(membership_.members())},
                     {"evictions", ev},
                     {"joins", joins_json()},
                     {"tokens", tokens_json()}};
  if (!joined_.is_null()) j["membership"]["joined"] = joined_;
  return j;
}

nlohmann::json Diloco::memory_json() const {
  // Host bytes the outer loop holds for this rank's shard, by what they are: kept between
  // rounds (global weights, the outer optimizer's state, the error-feedback residual) and, at
  // their peak, the rounds' own buffers (the shard's snapshot, turned into the pseudo-gradient
  // in place, a decoded frame, the average: 12 bytes per element of a fragment in flight; with several fragments
  // only those in flight hold them, begin_round_buffers / end_round_buffers).
  uint64_t elements = 0, global = 0, optimizer = 0, residual = 0;
  for (const auto& f : frags_) {
    elements += f->n;
    global += f->global.capacity();
    if (f->opt) optimizer += f->opt->state_size();
    if (f->ef) residual += f->ef->residual().size();
    // outer.exchange: owner: the owners' residual and the round's (f.owner_next) while it is decided.
    if (f->owner_ef) residual += f->owner_ef->residual().size() + f->owner_next.capacity();
  }
  const uint64_t kept = (global + optimizer + residual) * sizeof(float), round = round_buffer_peak_;
  const double per = elements ? 1.0 / double(elements) : 0.0;
  return {{"shard_elements", elements},
          {"global_bytes", global * sizeof(float)},
          {"optimizer_bytes", optimizer * sizeof(float)},
          {"error_feedback_bytes", residual * sizeof(float)},
          {"round_buffer_bytes", round},
          {"kept_bytes_per_param", double(kept) * per},
          {"round_bytes_per_param", double(round) * per},
          {"bytes_per_param", double(kept + round) * per},
          // Quantized on the device (outer.quantize_on): the fragments' global weights and
          // residuals there, and the round's scratch (trainer/loop/device_outer.hpp).
          {"device_bytes", device_ ? device_->device_bytes() : 0},
          {"device_bytes_per_param", device_ ? double(device_->device_bytes()) * per : 0.0}};
}

nlohmann::json Diloco::tokens_json() const {
  const uint64_t per_step = tokens_since(1, 0);
  const uint64_t trained = static_cast<uint64_t>(trained_steps_) * per_step;
  nlohmann::json by_site = nlohmann::json::object();
  for (size_t s = 0; s < cfg_.sites.size(); ++s)
    by_site[cfg_.sites[s].name] = static_cast<uint64_t>(std::llround(committed_tokens_[s]));
  const uint64_t mine = static_cast<uint64_t>(std::llround(committed_tokens_[static_cast<size_t>(site_)]));
  return {{"site", cfg_.sites[static_cast<size_t>(site_)].name},
          {"trained", trained},
          {"committed", mine},
          {"not_committed", trained > mine ? trained - mine : 0},
          {"committed_by_site", by_site},
          {"counted_after_round", tokens_first_round_}};
}

nlohmann::json Diloco::member_names(SiteMask m) const {
  nlohmann::json a = nlohmann::json::array();
  for (size_t s = 0; s < cfg_.sites.size(); ++s)
    if ((m >> s) & 1) a.push_back(cfg_.sites[s].name);
  return a;
}

}  // namespace geoloco::outer

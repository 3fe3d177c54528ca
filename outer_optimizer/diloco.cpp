// Diloco: construction, the step's actions as the schedule decides them, and the round life
// cycle -- sync, launch, vote, decide, apply, merge (diloco.hpp).
#include "outer_optimizer/diloco.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>

#include "core/error.hpp"
#include "core/hash.hpp"
#include "core/trace.hpp"
#include "outer_optimizer/membership_driver.hpp"
#include "outer_optimizer/round_sync.hpp"

namespace geoloco::outer {

namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

Diloco::Diloco(OuterOptions options, transport::Transport* transport, Site& site)
    : opt_((options.validate(), std::move(options))),
      ocfg_(opt_.outer),
      site_(site),
      peers_(opt_, transport),
      ctx_{opt_, peers_, site.trace()},
      membership_(opt_, peers_),
      planner_(opt_, peers_),
      books_(opt_),
      pace_(opt_),
      n_(static_cast<size_t>(site.shard().count)),
      shard_(site.shard()),
      gpu_site_(site.device() != nullptr),
      interval_(ocfg_.interval),
      pcfg_(ocfg_.compression) {
  const int S = opt_.site_count();
  GEOLOCO_CHECK_EQ(site.ranks(), opt_.sites[static_cast<size_t>(opt_.site)].ranks, "site {}: ranks", opt_.name());
  GEOLOCO_CHECK_EQ(site.rank(), opt_.rank, "site {}: rank", opt_.name());
  GEOLOCO_CHECK(shard_ == peers_.layout().shard(opt_.site, opt_.rank),
                "site {} rank {}: shard [{}, {}) but the exchange layout has [{}, {})", opt_.name(), opt_.rank,
                shard_.offset, shard_.end(), peers_.layout().shard(opt_.site, opt_.rank).offset,
                peers_.layout().shard(opt_.site, opt_.rank).end());
  const auto shard = site.shard_params();
  GEOLOCO_CHECK_EQ(shard.size(), n_, "site {} rank {}: shard values", opt_.name(), opt_.rank);
  joins_.watch.resize(static_cast<size_t>(S));
  for (int s = 0; s < S; ++s)
    if (s != opt_.site && transport)
      for (int q : peers_.partnered_by(s)) joins_.watch[static_cast<size_t>(s)].push_back(JoinWatch{q, 0, {}, false});
  // Every site starts from the same initial weights (same seed): check it before training.
  if (transport && !opt_.joining) {
    std::vector<PieceHash> hs;
    for (uint32_t pi : peers_.layout().pieces_of(opt_.site, opt_.rank)) {
      const Piece& p = peers_.layout().pieces()[pi];
      hs.push_back(
          {pi, hash64(shard.data() + (p.begin - shard_.offset), static_cast<size_t>(p.size()) * sizeof(float))});
    }
    HashCheck c = post_hash_check(peers_, hs, 0);
    verify_hash_check(peers_, opt_, c);
  }
  // outer.quantize_on: a GPU site quantizes its rounds on the device (a capture of the
  // pseudo-gradients for bench/compression needs them on the host: the host path then).
  if (ocfg_.quantize_on != QuantizeOn::Host && transport) {
    device_ = site.device();
    if (device_ && !opt_.hooks.capture_dir.empty()) {
      if (opt_.rank == 0)
        spdlog::info("site {}: pseudo-gradients are captured on the host: quantized there this run", opt_.name());
      device_ = nullptr;
    }
  }
  exchange_ =
      make_exchange(ocfg_.owner_exchange() && S > 1 ? ExchangeKind::Owner : ExchangeKind::AllToAll, S, opt_.site);
  build_fragments(ocfg_.fragments, shard);
  site_hash_ = combine_site_hash(piece_hashes());
  // The config's own schedule is plan epoch 0.
  plan_.interval = interval_;
  plan_.fragments = ocfg_.fragments;
  plan_.codec = std::string(compression::codec_name(pcfg_.codec));
  plan_.lanes = transport ? transport->lanes() : 1;
  plan_.reason = "the configured schedule (outer.plan: manual)";
  planned_ = !ocfg_.auto_plan() || S == 1;
  if (planned_) prefault_round_buffers();  // (under plan: auto, the plan's fragments are)
  if (ocfg_.auto_plan() && S == 1 && opt_.rank == 0)
    spdlog::warn("outer.plan: auto needs more than one site; keeping the configured schedule");
  if (opt_.rank == 0 && plans_.size() > 1)
    for (const auto& p : plans_) spdlog::info("outer loop: {}", p.describe());
}

Diloco::~Diloco() {
  // A run that failed with syncs in flight or a probe running: what they still wait for is
  // cancelled (the operations own their buffers), so the joins are prompt. (After a run that
  // ended well nothing is pending and this cancels nothing.)
  membership_.stop();
  joins_.donors.clear();  // stops serving joiners
  try {
    peers_.cancel_all("the outer loop is stopping");
  } catch (const std::exception& e) {
    spdlog::debug("outer loop: cancel at shutdown: {}", e.what());
  }
  for (auto& f : frags_) {
    if (f->round.worker.joinable()) f->round.worker.join();
    if (f->round.agreer.joinable()) f->round.agreer.join();
  }
}

// ---- the schedule ---------------------------------------------------------------------

bool Diloco::trains_step(int64_t step) { return pace_.trains(step, epoch_start_, interval_, planned_, peers_.sites()); }

StepState Diloco::step_state(int64_t step) const {
  StepState s;
  s.step = step;
  s.total_steps = opt_.total_steps;
  s.interval = interval_;
  s.epoch_start = epoch_start_;
  s.checkpoint_every = opt_.checkpoint_every;
  s.overlapped = overlapped();
  s.auto_plan = ocfg_.auto_plan() && opt_.site_count() > 1;
  s.planned = planned_;
  s.plan_at = first_step_ + ocfg_.plan_measure_steps;
  for (const auto& f : frags_) {
    const Round& r = f->round;
    s.fragments.push_back({plans_[static_cast<size_t>(f->state.index)].offset, r.pending_merge, r.merge_step,
                           r.awaiting_decision, r.voted, r.vote_step});
  }
  return s;
}

bool Diloco::after_inner_step(int64_t step) {
  step_ = step;
  // The inner step's time: from the end of the previous call to the start of this one (a step
  // outer.pace: time skipped took none: not a sample).
  const auto now = Clock::now();
  const bool trained = !pace_.skipped(step);
  books_.count_step(trained);
  if (last_call_end_ == Clock::time_point{}) {
    first_step_ = step - 1;  // the step this run (segment) started from
  } else if (trained) {
    const double dt = std::chrono::duration<double>(now - last_call_end_).count();
    step_times_.push_back(dt);
    pace_.sample(dt);
  }
  StepPlan plan = decide_step(step_state(step));
  // A checkpoint's decisions come after the step's own work (whose end times the next step).
  const bool decide = !plan.rest.empty() && plan.rest.back().act == Act::DecideInFlight;
  if (decide) plan.rest.pop_back();
  bool any = false;
  {
    struct Stamp {
      Clock::time_point& t;
      ~Stamp() { t = Clock::now(); }
    } stamp{last_call_end_};
    {
      const FlagScope merging{in_merges_, true};
      for (const Action& a : plan.merges) {
        complete(*frags_[static_cast<size_t>(a.fragment)]);
        any = true;
      }
    }
    any = run_rest(step, plan.rest, any);
  }
  if (decide) {
    decide_in_flight();
    any = true;
  }
  // Sites a round of this step took in get the state once everything of the step is done.
  if (joins_.admitted) {
    serve_admitted(step);
    return true;
  }
  return any;
}

bool Diloco::run_rest(int64_t step, const std::vector<Action>& rest, bool any) {
  bool replanned = false;
  for (const Action& a : rest) {
    Fragment* f = a.fragment >= 0 ? frags_[static_cast<size_t>(a.fragment)].get() : nullptr;
    switch (a.act) {
      case Act::Merge:
        complete(*f);
        any = true;
        break;
      case Act::Vote: vote(*f, /*background=*/true); break;
      case Act::FinalSync:
        final_sync(step);
        any = true;
        break;
      case Act::Probe:
        // Rank 0 probes the other sites in the background while the first steps are timed
        // (started here, not at construction, so a run resumed with its plan never probes).
        planner_.start_probe();
        break;
      case Act::InitialPlan: apply_plan(planner_.initial(site_, step_times_), step, /*initial=*/true); break;
      case Act::Boundary: {
        const int64_t index = (step - epoch_start_) / interval_;
        auto next = planner_.boundary(step, index, site_, plan_, boundary_syncs_, step_times_);
        boundary_syncs_.clear();
        step_times_.clear();
        if (next) {
          apply_plan(*next, step, /*initial=*/false);
          replanned = any = true;  // the new schedule starts here: nothing else syncs at this step
        }
        break;
      }
      case Act::Sync:
        if (!replanned) {
          sync(*f, step);
          any = true;
        }
        break;
      case Act::Launch:
        if (!replanned) launch(*f, step);
        break;
      case Act::DecideInFlight:
        decide_in_flight();
        any = true;
        break;
    }
  }
  return any;
}

void Diloco::finish(int64_t step) {
  final_sync(step);
  serve_admitted(step);
  if (opt_.rank != 0) return;
  const nlohmann::json t = books_.tokens_json();
  const uint64_t lost = t["not_committed"].get<uint64_t>();
  spdlog::info("site {}: trained {} tokens{}, {} in committed rounds{}", t["site"].get<std::string>(),
               t["trained"].get<uint64_t>(),
               books_.counts_start() > 0 ? fmt::format(" after outer round {}", books_.counts_start()) : std::string(),
               t["committed"].get<uint64_t>(),
               lost ? fmt::format(", {} not committed (rounds it was left out of)", lost) : std::string());
}

void Diloco::final_sync(int64_t step) {
  for (auto& f : frags_)
    if (f->round.pending_merge) complete(*f);
  for (auto& f : frags_)
    if (f->state.blocking_step != step) sync(*f, step);
  // Every site ends with the same weights, verified (the run's one blocking check).
  verify_pending_checks();
}

void Diloco::decide_in_flight() {
  for (auto& f : frags_) {
    join_worker(f->round);
    if (f->round.awaiting_decision) f->round.result = decide_or_keep(*f);
  }
}

// ---- the round life cycle ---------------------------------------------------------------

int Diloco::trace_tid(const Fragment& f) const {
  return f.state.index == 0 ? TraceRecorder::kOuterThread : TraceRecorder::kFragmentThreadBase + f.state.index;
}

uint64_t Diloco::round_tokens(Fragment& f, int64_t step) {
  FragmentState& s = f.state;
  if (!pace_.enabled()) return books_.tokens_of(step - s.last_sync_step);
  f.round.step_us = pace_.agreed_step_us(site_);
  const int64_t trained = std::max<int64_t>(0, books_.trained_steps() - s.last_sync_trained);
  s.last_sync_trained = books_.trained_steps();
  return books_.tokens_of(trained);
}

void Diloco::snapshot(Fragment& f, bool quantize) {
  const size_t n = f.state.n;
  buffers_.begin(f.round, n, !store_->on_device(), [&] {
    uint64_t held = 0;
    for (const auto& g : frags_)
      held += g->round.delta.capacity() + g->round.decoded.capacity() + g->round.avg.capacity();
    return held;
  });
  const uint64_t host = store_->snapshot(f.state, f.round, pcfg_, exchange_->frames(f.state), quantize);
  books_.count_snapshot(n * sizeof(float), host);
}

void Diloco::sync(Fragment& f, int64_t step, const Retry* again) {
  const auto t0 = Clock::now();
  const uint64_t round = static_cast<uint64_t>(++round_);
  Round& r = f.round;
  // `again`: sent as made before (not quantized again: the residual already holds its
  // error); the round's error figures against the shard's values.
  snapshot(f, /*quantize=*/!again);
  r.attachment = planned_ ? planner_.attachment() : std::vector<uint8_t>{};
  const uint64_t tokens = round_tokens(f, step);
  collect_round(f.state, r, *exchange_, ctx_, step, round, tokens, r.delta, membership_.active(round),
                membership_.deadline_s(), TraceRecorder::kMainThread, again ? &again->mine : nullptr);
  ExchangeResult res;
  try {
    res = decide_and_apply(f, TraceRecorder::kMainThread);
  } catch (const QuorumLost&) {
    // Nothing of the round is applied: the state is the last committed one, plus this rank's
    // contribution (and its encoding error in the residual). A checkpoint of it lets --resume
    // exchange this round again, as if the wait had been longer. (With overlap a blocking round
    // is the last step's or a re-plan's: only the last step's is kept, the others resume from
    // the last periodic checkpoint.)
    if (!overlapped() || step == opt_.total_steps)
      retries_ = {Retry{f.state.index, round, step, step, OwnContribution{r.inbox.mine, r.inbox.infos}}};
    throw;
  }
  f.state.last_sync_step = step;
  f.state.blocking_step = step;
  // 5. local <- global; the site re-assembles its replica.
  {
    TraceSpan sp(ctx_.trace, "outer_step", TraceRecorder::kMainThread);
    store_->merge(f.state, -1.0f);
    if (ocfg_.inner_state == InnerState::Reset) site_.reset_inner_state();
  }
  finish_round(f, step, round, std::chrono::duration<double>(Clock::now() - t0).count(), res);
}

void Diloco::launch(Fragment& f, int64_t step) {
  const uint64_t round = static_cast<uint64_t>(++round_);
  Round& r = f.round;
  const uint64_t tokens = round_tokens(f, step);
  // The worker reads a snapshot (r.delta, turned into the pseudo-gradient in place): the inner
  // loop keeps training the live shard meanwhile.
  snapshot(f);
  r.attachment = planned_ ? planner_.attachment() : std::vector<uint8_t>{};
  f.state.last_sync_step = step;
  r.launch_step = step;
  r.number = round;
  r.merge_step = step + tau();
  // The site votes on the round's membership halfway to the merge, so the consensus with the
  // other sites runs behind the remaining steps (tau 1: at the merge).
  r.vote_step = tau() >= 2 ? step + (tau() + 1) / 2 : r.merge_step;
  r.voted = false;
  r.awaiting_decision = true;
  r.pending_merge = true;
  launch_worker(f.state, r, *exchange_, ctx_, step, round, tokens, membership_.active(round), membership_.deadline_s(),
                trace_tid(f));
}

void Diloco::vote(Fragment& f, bool background) {
  Round& r = f.round;
  join_worker(r);  // the collection
  const RoundInbox& in = r.inbox;
  membership_.record_wait(in.wait_s);
  TraceSpan sp(ctx_.trace, "membership_vote", TraceRecorder::kMainThread);
  const auto t0 = Clock::now();
  try {
    if (split_possible()) check_split(in.round, in.step);
    r.site_holds = membership_.vote_site(in.round, in.holds, poll_join_requests(in.round), site_);
  } catch (Error& e) {
    e.add_context(fmt::format("outer step {} (inner step {})", in.round, in.step));
    throw;
  }
  r.voted = true;
  r.verdict.clear();
  if (opt_.rank == 0) {
    const uint64_t round = in.round;
    const SiteMask holds = r.site_holds, expected = membership_.active(round), in_run = membership_.members();
    if (background) {
      Round* rp = &r;
      const RoundMembership* m = &membership_;
      r.agreer = std::thread(
          [rp, m, round, holds, expected, in_run] { rp->verdict = m->agree(round, holds, expected, in_run); });
    } else {
      r.verdict = membership_.agree(round, holds, expected, in_run);
    }
  }
  r.vote_s = std::chrono::duration<double>(Clock::now() - t0).count();
}

ExchangeResult Diloco::decide_and_apply(Fragment& f, int tid) {
  Round& r = f.round;
  if (!r.voted) vote(f, /*background=*/false);
  const RoundInbox& in = r.inbox;
  SiteMask members = 0;
  double exposed = r.vote_s;
  const SiteMask before = membership_.active(in.round);
  {
    TraceSpan sp(ctx_.trace, "membership", tid);
    const auto t0 = Clock::now();
    if (r.agreer.joinable()) r.agreer.join();
    try {
      try {
        members = membership_.share(in.round, in.step, r.site_holds, std::move(r.verdict), in.missing, site_);
      } catch (const SiteLeftOut&) {
        // Left out after a partition healed: the other side's split status arrived before the
        // decision that left this site out; its heal rule (which side is kept, the tokens
        // discarded) says more than "left out", so it speaks if it applies (every rank here).
        if (split_possible()) check_split(in.round, in.step);
        throw;
      }
    } catch (Error& e) {
      e.add_context(fmt::format("outer step {} (inner step {})", in.round, in.step));
      r.voted = false;
      throw;
    }
    exposed += std::chrono::duration<double>(Clock::now() - t0).count();
  }
  r.voted = false;
  r.awaiting_decision = false;
  const SiteMask joiners = members & ~before;
  for (int s = 0; s < static_cast<int>(joins_.watch.size()); ++s)
    if ((joiners >> s) & 1)
      for (auto& w : joins_.watch[static_cast<size_t>(s)]) w.requested = false;
  joins_.admitted |= joiners;  // served the state at the end of the step (serve_admitted)
  ExchangeResult res = apply_round(f.state, r, *exchange_, ctx_, members, joiners, tid);
  res.membership_s = exposed;
  // outer.plan: auto: the members' reports and decisions this round carried (plan_coordinator.hpp).
  if (ocfg_.auto_plan() && planned_) planner_.committed(in.round, res.attachments, members & ~joiners, plan_);
  r.inbox = RoundInbox{};  // applied: nothing left to decide
  return res;
}

ExchangeResult Diloco::decide_or_keep(Fragment& f) {
  try {
    return decide_and_apply(f, trace_tid(f));
  } catch (const QuorumLost&) {
    // Nothing of this round or of the rounds still in flight is applied: a checkpoint of them
    // lets --resume exchange them all again (resumed()), as if the wait had been longer.
    retries_ = undecided_rounds(f);
    retry_rest_ = in_merges_;
    throw;
  }
}

std::vector<Diloco::Retry> Diloco::undecided_rounds(Fragment& failed) {
  std::vector<Retry> out;
  for (auto& f : frags_) {
    Round& r = f->round;
    if (f.get() != &failed) {
      if (!r.awaiting_decision) continue;
      join_worker(r);  // its exchange ends by its deadline
    }
    out.push_back(
        Retry{f->state.index, r.number, r.launch_step, r.merge_step, OwnContribution{r.inbox.mine, r.inbox.infos}});
  }
  std::sort(out.begin(), out.end(), [](const Retry& a, const Retry& b) { return a.round < b.round; });
  return out;
}

void Diloco::complete(Fragment& f) {
  Round& r = f.round;
  join_worker(r);
  // A restored checkpoint's pending merge has its round applied already (no inbox).
  if (r.awaiting_decision) r.result = decide_or_keep(f);
  // local <- alpha * local + (1 - alpha) * global: keeps part of the inner progress made
  // while the sync was in flight.
  {
    TraceSpan sp(ctx_.trace, "merge", TraceRecorder::kMainThread);
    store_->merge(f.state, static_cast<float>(ocfg_.merge_alpha));
    if (ocfg_.inner_state == InnerState::Reset) site_.reset_inner_state();
  }
  r.pending_merge = false;
  // A restored checkpoint has no worker timing: count the round with its joined time only.
  const double secs = r.joined ? r.joined_seconds : 0.0;
  r.joined = false;
  finish_round(f, r.launch_step, r.number, secs, r.result);
}

void Diloco::finish_round(Fragment& f, int64_t step, uint64_t round, double seconds, const ExchangeResult& res) {
  buffers_.end(f.round, frags_.size() > 1);
  f.state.hash = res.hash;
  f.state.segment_hash = res.segment_hash;
  site_hash_ = combine_site_hash(piece_hashes());
  // outer.plan: auto's drift test: a fragment's first round since it was built pays its
  // first-touch costs (buffers, transport registration): not what the next ones will take.
  if (f.state.rounds_done++ > 0) boundary_syncs_.push_back(seconds);
  uint64_t all = 0;
  for (const auto& p : plans_) all += static_cast<uint64_t>(p.elements());
  const double share = all > 0 ? double(plans_[static_cast<size_t>(f.state.index)].elements()) / double(all)
                               : 1.0 / double(frags_.size());
  books_.count_round(seconds, res, share);
  if (pace_.enabled()) pace_.decide(site_, round, step, interval_, res.step_us);
  record_round(f, step, round, seconds, res);
  if (opt_.rank == 0) {
    const std::string frag =
        frags_.size() > 1 ? fmt::format(" fragment {}/{}", f.state.index, frags_.size()) : std::string();
    spdlog::info(
        "outer step {}{} at inner step {}: sync {:.3f} s, {} bytes/rank/peer (x{:.1f} vs fp32), global weights {}",
        round, frag, step, seconds, res.envelope_bytes, res.ratio, hex64(site_hash_));
  }
}

void Diloco::verify_pending_checks() {
  for (auto& f : frags_) {
    if (!f->state.check || f->round.in_flight) continue;  // in flight: the worker verifies it
    TraceSpan sp(ctx_.trace, "hash_check", TraceRecorder::kMainThread);
    // When the run outlives a site, a member lost since the round is no divergence (it is out
    // of the next round, or the run ended); with every site needed, its loss is an error.
    verify_hash_check(peers_, opt_, *f->state.check, membership_.quorum() < peers_.sites());
    f->state.check.reset();
  }
}

std::vector<uint64_t> Diloco::piece_hashes() const {
  // By piece of this shard: with one fragment, its segment's hash (the whole shard's when the
  // sites have one rank count); with several, a hash of the fragments' hashes of it.
  std::vector<uint64_t> out;
  const size_t K = frags_.front()->state.segments.size();
  for (size_t k = 0; k < K; ++k) {
    if (frags_.size() == 1) {
      out.push_back(frags_[0]->state.segment_hash.at(k));
      continue;
    }
    Hasher hs;
    for (const auto& f : frags_) hs.update(&f->state.segment_hash.at(k), sizeof(uint64_t));
    out.push_back(hs.digest());
  }
  return out;
}

uint64_t Diloco::combine_site_hash(const std::vector<uint64_t>& pieces) {
  // The pieces' hashes in piece order (the ranks' in rank order): the same list, so the same
  // hash, at every site whatever its rank count.
  const auto bytes = std::as_bytes(std::span<const uint64_t>(pieces));
  if (site_.ranks() == 1) return hash64(bytes.data(), bytes.size());
  Hasher hs;
  for (auto& b : site_.all_gather(bytes)) hs.update(b.data(), b.size());
  return hs.digest();
}

}  // namespace geoloco::outer

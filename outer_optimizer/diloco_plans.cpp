// Diloco's schedule in force and the fragments it cuts: building them, a plan applied at a
// boundary (outer.plan: auto) with the global weights, outer-optimizer state and error
// feedback carried across the new cut, and the outer state in shard layout (diloco.hpp).
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <bit>

#include "core/error.hpp"
#include "core/hash.hpp"
#include "outer_optimizer/diloco.hpp"
#include "outer_optimizer/owner_exchange.hpp"
#include "outer_optimizer/round_sync.hpp"

namespace geoloco::outer {

void Diloco::build_fragments(int fragments, std::span<const float> global) {
  for (const auto& f : frags_)
    GEOLOCO_CHECK(!f->state.check, "fragments rebuilt with a hash check of round {} unverified", f->state.check->round);
  plans_ = plan_fragments(opt_.params, fragments, interval_);
  frags_.clear();
  if (device_) device_->clear();
  store_ = make_fragment_store(site_, device_, pcfg_);
  const int S = peers_.sites();
  for (const auto& plan : plans_) {
    auto frag = std::make_unique<Fragment>();
    FragmentState& f = frag->state;
    f.index = plan.index;
    f.local = intersect(plan.ranges, shard_);
    for (const auto& r : f.local) f.n += static_cast<size_t>(r.size());
    f.global.resize(f.n);
    gather_local(f, global, f.global);
    f.pipeline = std::make_unique<compression::Pipeline>(pcfg_);
    if (pcfg_.error_feedback) f.ef = std::make_unique<compression::ErrorFeedback>(f.n);
    f.opt = std::make_unique<OuterOptimizer>(ocfg_.optimizer, f.n);
    f.hash = hash64(f.global.data(), f.global.size() * sizeof(float));
    f.segments = cut_segments(f.local, shard_, peers_.layout(), opt_.site, opt_.rank);
    // (after the segments: it holds the elements of this site's slices of them)
    if (pcfg_.error_feedback && exchange_->kind() == ExchangeKind::Owner)
      f.owner_ef = std::make_unique<compression::ErrorFeedback>(owned_count(f, opt_.site, S));
    f.segment_hash = segment_hashes(f.segments, f.global);
    store_->define(f);
    frags_.push_back(std::move(frag));
  }
}

void Diloco::prefault_round_buffers() {
  size_t largest = 0;
  for (auto& f : frags_) {
    largest = std::max(largest, f->state.n);
    f->state.pipeline->reserve(f->state.n);
  }
  if (frags_.size() == 1) {
    Round& r = frags_[0]->round;
    buffers_.begin(r, frags_[0]->state.n, !store_->on_device(),
                   [&] { return r.delta.capacity() + r.decoded.capacity() + r.avg.capacity(); });
  } else {
    buffers_.prefault(largest, !store_->on_device());
  }
}

void Diloco::set_schedule(const PlanDecision& d, std::span<const float> global) {
  verify_pending_checks();
  interval_ = d.interval;
  pcfg_ = plan_compression(ocfg_.compression, d);
  if (ocfg_.exchange_auto())
    exchange_ = make_exchange(
        d.exchange == ExchangeKind::Owner && peers_.sites() > 1 ? ExchangeKind::Owner : ExchangeKind::AllToAll,
        peers_.sites(), opt_.site);
  if (auto* t = peers_.transport()) t->set_active_lanes(std::min(d.lanes, t->lanes()));
  buffers_.clear();
  build_fragments(d.fragments, global);
  prefault_round_buffers();
}

void Diloco::apply_plan(const PlanDecision& d, int64_t step, bool initial) {
  if (!initial) {
    // Land everything under the old schedule: merges, then a blocking sync of every fragment.
    for (auto& f : frags_)
      if (f->round.pending_merge) complete(*f);
    for (auto& f : frags_)
      if (f->state.blocking_step != step) sync(*f, step);
  }
  // Carry the global weights, outer-optimizer state and error feedback across the new cut.
  const ShardState st = pack_state();
  int64_t opt_steps = 0;
  for (auto& f : frags_) opt_steps = std::max(opt_steps, f->state.opt->steps());
  set_schedule(d, st.global);
  unpack_state(st);
  for (auto& f : frags_) {
    f->state.opt->set_steps(opt_steps);
    f->state.last_sync_step = initial ? 0 : step;
    f->state.last_sync_trained = initial ? 0 : books_.trained_steps();
    f->state.blocking_step = initial ? -1 : step;
  }
  epoch_start_ = step;
  plan_ = d;
  plan_history_.push_back(d);
  planned_ = true;
  planner_.restart();
  step_times_.clear();
  boundary_syncs_.clear();
  site_hash_ = combine_site_hash(piece_hashes());
  log_plan(d, step);
}

void Diloco::log_plan(const PlanDecision& d, int64_t step) const {
  if (opt_.rank != 0) return;
  spdlog::info(
      "outer plan (epoch {}, from step {}): H {}, {} fragment(s), {}, {} lane(s); predicted utilization {:.4f}. {}",
      d.epoch, step, d.interval, d.fragments, d.codec, d.lanes, d.predicted_utilization, d.reason);
  // plan.json: written by the lowest-index site still in the run (site 0 unless it was lost).
  if (const SiteMask m = membership_.members(); m ? std::countr_zero(m) != opt_.site : opt_.site != 0) return;
  nlohmann::json all = nlohmann::json::array();
  for (const auto& p : plan_history_) all.push_back(p.to_json());
  site_.write_plans(nlohmann::json({{"format", "geoloco-plan"}, {"version", 1}, {"plans", all}}));
}

// ---- the outer state in shard layout ---------------------------------------------------

void Diloco::restore_owner_residual(FragmentState& f, std::span<const float> shard) const {
  std::vector<float> gathered(f.n);
  gather_local(f, shard, gathered);
  gather_owned(f, opt_.site, peers_.sites(), gathered, f.owner_ef->residual());
}

std::vector<float> Diloco::pack_owner_residual() const {
  std::vector<float> out(n_, 0.0f), gathered;
  for (const auto& frag : frags_) {
    const FragmentState& f = frag->state;
    gathered.assign(f.n, 0.0f);
    expand_owned(f, opt_.site, peers_.sites(), f.owner_ef->residual(), gathered);
    scatter_local(f, gathered, out);
  }
  return out;
}

Diloco::ShardState Diloco::pack_state() {
  for (auto& f : frags_) store_->residual_to_host(f->state);
  // Each fragment's vectors scattered back to where their elements sit in the shard.
  auto pack = [&](auto get) {
    std::vector<float> out(n_, 0.0f);
    for (const auto& f : frags_) scatter_local(f->state, get(f->state), out);
    return out;
  };
  const FragmentState& first = frags_[0]->state;
  ShardState st;
  st.global = pack([](const FragmentState& f) { return std::span<const float>(f.global); });
  if (!first.opt->state_a().empty())
    st.opt_a = pack([](const FragmentState& f) { return std::span<const float>(f.opt->state_a()); });
  if (!first.opt->state_b().empty())
    st.opt_b = pack([](const FragmentState& f) { return std::span<const float>(f.opt->state_b()); });
  if (first.ef) st.ef = pack([](const FragmentState& f) { return std::span<const float>(f.ef->residual()); });
  if (first.owner_ef) st.owner_ef = pack_owner_residual();
  return st;
}

void Diloco::unpack_state(const ShardState& st) {
  for (auto& frag : frags_) {
    FragmentState& f = frag->state;
    gather_local(f, st.global, f.global);
    if (!st.opt_a.empty()) gather_local(f, st.opt_a, f.opt->state_a());
    if (!st.opt_b.empty()) gather_local(f, st.opt_b, f.opt->state_b());
    if (!st.ef.empty() && f.ef) gather_local(f, st.ef, f.ef->residual());
    if (!st.owner_ef.empty() && f.owner_ef) restore_owner_residual(f, st.owner_ef);
    f.hash = hash64(f.global.data(), f.global.size() * sizeof(float));
    f.segment_hash = segment_hashes(f.segments, f.global);
    store_->define(f);
  }
}

std::vector<std::span<const float>> Diloco::shard_views(
    const std::function<std::span<const float>(FragmentState&)>& get) {
  // Every fragment's ranges, in shard order: pieces of its gathered vector (pack_state's
  // order, without the copy). The fragments' ranges tile the shard.
  struct Part {
    int64_t begin;
    std::span<const float> values;
  };
  std::vector<Part> parts;
  for (auto& frag : frags_) {
    const std::span<const float> v = get(frag->state);
    size_t k = 0;
    for (const auto& r : frag->state.local) {
      parts.push_back({r.begin, v.subspan(k, static_cast<size_t>(r.size()))});
      k += static_cast<size_t>(r.size());
    }
  }
  std::sort(parts.begin(), parts.end(), [](const Part& a, const Part& b) { return a.begin < b.begin; });
  std::vector<std::span<const float>> out;
  int64_t at = 0;
  for (const auto& p : parts) {
    GEOLOCO_CHECK(p.begin == at, "outer state: the fragments' ranges leave [{}, {}) of the shard uncovered", at,
                  p.begin);
    at += static_cast<int64_t>(p.values.size());
    out.push_back(p.values);
  }
  GEOLOCO_CHECK_EQ(at, static_cast<int64_t>(n_), "outer state: the fragments' ranges against the shard's elements");
  return out;
}

}  // namespace geoloco::outer

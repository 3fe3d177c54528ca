// The CPU site strategies: ddp, zero1, zero2, fsdp and hybrid over the site's collective
// (site_strategy.hpp).
#include "trainer/loop/site_strategy.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "core/error.hpp"
#include "trainer/optim/grad_clip.hpp"

namespace geoloco::trainer {

StrategyKind parse_strategy(const std::string& name) {
  if (name == "ddp") return StrategyKind::Ddp;
  if (name == "zero1") return StrategyKind::Zero1;
  if (name == "zero2") return StrategyKind::Zero2;
  if (name == "fsdp") return StrategyKind::Fsdp;
  if (name == "hybrid") return StrategyKind::Hybrid;
  throw InputError("unknown strategy '" + name + "' (expected ddp | zero1 | zero2 | fsdp | hybrid)");
}

const char* strategy_name(StrategyKind k) {
  switch (k) {
    case StrategyKind::Ddp: return "ddp";
    case StrategyKind::Zero1: return "zero1";
    case StrategyKind::Zero2: return "zero2";
    case StrategyKind::Fsdp: return "fsdp";
    case StrategyKind::Hybrid: return "hybrid";
  }
  return "?";
}

SiteStrategy::SiteStrategy(StrategyKind kind, const ParamLayout& layout, parallel::Collective* coll,
                           const OptimizerConfig& optimizer, std::span<const float> initial, bool optimizer_state,
                           int group_size)
    : kind_(kind), layout_(layout), coll_(coll), n_(layout.total()) {
  GEOLOCO_CHECK_EQ(static_cast<int64_t>(initial.size()), n_, "initial params");
  if (coll_ && coll_->size() == 1) coll_ = nullptr;
  shard_ = shard_of(n_, rank(), ranks());
  if (kind_ == StrategyKind::Hybrid) {
    init_hybrid(group_size);
    const auto& h = *hybrid_;
    params_.resize(static_cast<size_t>(h.held));
    for (int g = 0; g < h.groups; ++g) {
      const auto p = h.pieces[static_cast<size_t>(g)];
      std::copy(initial.begin() + p.offset, initial.begin() + p.end(),
                params_.begin() + h.held_offset[static_cast<size_t>(g)]);
    }
  } else if (kind_ == StrategyKind::Fsdp) {
    params_.assign(initial.begin() + shard_.offset, initial.begin() + shard_.end());
  } else {
    params_.assign(initial.begin(), initial.end());
  }
  const bool sharded_opt = kind_ != StrategyKind::Ddp;
  const int64_t begin = sharded_opt ? shard_.offset : 0, end = sharded_opt ? shard_.end() : n_;
  opt_ = optimizer_state ? std::make_unique<InnerOptimizer>(optimizer, layout_, begin, end)
                         : std::make_unique<InnerOptimizer>(optimizer, layout_, 0, 0);
  plan_muon_parts(optimizer);
}

SiteStrategy::SiteStrategy(StrategyKind kind, const ParamLayout& layout, parallel::Collective* coll,
                           const OptimizerConfig& optimizer, NoHostState h)
    : kind_(kind), layout_(layout), coll_(coll), n_(layout.total()), host_(false) {
  if (coll_ && coll_->size() == 1 && !h.keep_one_rank_collective) coll_ = nullptr;
  shard_ = shard_of(n_, rank(), ranks());
  opt_ = std::make_unique<InnerOptimizer>(optimizer, layout_, 0, 0);
  plan_muon_parts(optimizer);
  if (kind_ == StrategyKind::Hybrid) init_hybrid(h.group_size);
}

void SiteStrategy::init_hybrid(int group_size) {
  hybrid_ = std::make_unique<parallel::HybridShards>(parallel::hybrid_shards(n_, rank(), ranks(), group_size));
  const auto& h = *hybrid_;
  if (!coll_) return;
  group_coll_ = coll_->split(h.group, h.local, fmt::format("group {}", h.group));
  replica_coll_ = coll_->split(h.local, h.group, fmt::format("replica set {}", h.local));
  if (group_coll_->size() == 1) group_coll_.reset();
  if (replica_coll_->size() == 1) replica_coll_.reset();
}

SiteStrategy::~SiteStrategy() = default;

void SiteStrategy::require_host(const char* what) const {
  GEOLOCO_CHECK(host_, "SiteStrategy::{} is the CPU path; this strategy keeps its buffers on a device", what);
}

std::span<const float> SiteStrategy::begin_step() {
  require_host("begin_step");
  grads_.assign(static_cast<size_t>(n_), 0.0f);
  if (kind_ == StrategyKind::Hybrid) {
    gather_held();
    peak_transient_bytes_ = std::max(peak_transient_bytes_, (gathered_.size() + grads_.size()) * sizeof(float));
    return gathered_;
  }
  if (kind_ == StrategyKind::Fsdp) {
    gathered_.assign(static_cast<size_t>(n_), 0.0f);
    std::copy(params_.begin(), params_.end(), gathered_.begin() + shard_.offset);
    if (coll_) coll_->all_gather(params_, gathered_);
    peak_transient_bytes_ = std::max(peak_transient_bytes_, (gathered_.size() + grads_.size()) * sizeof(float));
    return gathered_;
  }
  peak_transient_bytes_ = std::max(peak_transient_bytes_, grads_.size() * sizeof(float));
  return params_;
}

void SiteStrategy::reduce_full_grads() {
  if (!coll_) return;
  for (int64_t b = 0; b < n_; b += bucket_elems_) {
    const int64_t e = std::min(n_, b + bucket_elems_);
    coll_->all_reduce_sum(std::span<float>(grads_).subspan(static_cast<size_t>(b), static_cast<size_t>(e - b)));
  }
  const float inv = 1.0f / static_cast<float>(ranks());
  for (auto& g : grads_) g *= inv;
}

std::span<float> SiteStrategy::own_held() {
  return std::span<float>(params_).subspan(static_cast<size_t>(hybrid_->own_held_offset()),
                                           static_cast<size_t>(hybrid_->own.count));
}

void SiteStrategy::gather_held() {
  const auto& h = *hybrid_;
  gathered_.assign(static_cast<size_t>(n_), 0.0f);
  const std::span<float> full(gathered_);
  for (int g = 0; g < h.groups; ++g) {
    const auto p = h.pieces[static_cast<size_t>(g)];
    const auto b = h.blocks[static_cast<size_t>(g)];
    std::copy_n(params_.begin() + h.held_offset[static_cast<size_t>(g)], p.count, full.begin() + p.offset);
    if (group_coll_)
      group_coll_->all_gather(full.subspan(static_cast<size_t>(p.offset), static_cast<size_t>(p.count)),
                              full.subspan(static_cast<size_t>(b.offset), static_cast<size_t>(b.count)));
  }
}

void SiteStrategy::share_own_shard() {
  if (replica_coll_) replica_coll_->all_gather(own_held(), params_);
}

void SiteStrategy::clip_grad_shard(StepResult& r, double max_norm) {
  double sq = sum_of_squares(grad_shard_);
  if (coll_) {
    double buf[1] = {sq};
    coll_->all_reduce_sum(std::span<double>(buf, 1));
    sq = buf[0];
  }
  r.grad_norm = std::sqrt(sq);
  r.clip_scale = clip_to_norm(grad_shard_, r.grad_norm, max_norm);
}

StepResult SiteStrategy::finish_hybrid_step(double lr, double max_norm) {
  const auto& h = *hybrid_;
  StepResult r;
  // 1. Inside the group: each block's gradient reduce-scattered, piece by piece.
  std::vector<float> held_grads(static_cast<size_t>(h.held));
  for (int g = 0; g < h.groups; ++g) {
    const auto p = h.pieces[static_cast<size_t>(g)];
    const auto b = h.blocks[static_cast<size_t>(g)];
    auto out = std::span<float>(held_grads)
                   .subspan(static_cast<size_t>(h.held_offset[static_cast<size_t>(g)]), static_cast<size_t>(p.count));
    if (group_coll_) {
      group_coll_->reduce_scatter_sum(
          std::span<const float>(grads_).subspan(static_cast<size_t>(b.offset), static_cast<size_t>(b.count)), out);
    } else {
      std::copy_n(grads_.begin() + p.offset, p.count, out.begin());
    }
  }
  grads_.clear();
  grads_.shrink_to_fit();
  // 2. Over the replica set: the group sums of the own shard summed over the groups.
  grad_shard_.assign(static_cast<size_t>(h.own.count), 0.0f);
  if (replica_coll_) {
    replica_coll_->reduce_scatter_sum(held_grads, grad_shard_);
  } else {
    std::copy_n(held_grads.begin() + h.own_held_offset(), h.own.count, grad_shard_.begin());
  }
  peak_transient_bytes_ = std::max(peak_transient_bytes_, (gathered_.size() + held_grads.size()) * sizeof(float));
  held_grads = {};
  const float inv = 1.0f / static_cast<float>(ranks());
  for (auto& g : grad_shard_) g *= inv;
  clip_grad_shard(r, max_norm);
  opt_->step_shard(own_held(), grad_shard_, lr, site_gather());
  share_own_shard();
  gathered_.clear();
  gathered_.shrink_to_fit();
  return r;
}

StepResult SiteStrategy::finish_step(double lr, double max_norm) {
  require_host("finish_step");
  if (kind_ == StrategyKind::Hybrid) return finish_hybrid_step(lr, max_norm);
  StepResult r;
  switch (kind_) {
    case StrategyKind::Ddp:
    case StrategyKind::Zero1: {
      reduce_full_grads();
      r.grad_norm = std::sqrt(sum_of_squares(grads_));
      r.clip_scale = clip_to_norm(grads_, r.grad_norm, max_norm);
      if (kind_ == StrategyKind::Ddp) {
        opt_->step(params_, grads_, lr);
      } else {
        opt_->step(params_, grads_, lr, site_gather());  // only the shard's range [offset, end)
        if (coll_) {
          auto mine =
              std::span<float>(params_).subspan(static_cast<size_t>(shard_.offset), static_cast<size_t>(shard_.count));
          coll_->all_gather(mine, params_);
        }
      }
      break;
    }
    case StrategyKind::Zero2:
    case StrategyKind::Fsdp: {
      grad_shard_.assign(static_cast<size_t>(shard_.count), 0.0f);
      if (coll_) {
        coll_->reduce_scatter_sum(grads_, grad_shard_);
        const float inv = 1.0f / static_cast<float>(ranks());
        for (auto& g : grad_shard_) g *= inv;
      } else {
        std::copy(grads_.begin() + shard_.offset, grads_.begin() + shard_.end(), grad_shard_.begin());
      }
      // The full gradient is no longer needed: release it before the update.
      grads_.clear();
      grads_.shrink_to_fit();
      clip_grad_shard(r, max_norm);
      if (kind_ == StrategyKind::Zero2) {
        auto mine =
            std::span<float>(params_).subspan(static_cast<size_t>(shard_.offset), static_cast<size_t>(shard_.count));
        opt_->step_shard(mine, grad_shard_, lr, site_gather());
        if (coll_) coll_->all_gather(mine, params_);
      } else {
        opt_->step_shard(params_, grad_shard_, lr, site_gather());
        gathered_.clear();
        gathered_.shrink_to_fit();
      }
      break;
    }
    case StrategyKind::Hybrid: break;  // finish_hybrid_step
  }
  return r;
}

void SiteStrategy::plan_muon_parts(const OptimizerConfig& optimizer) {
  if (!coll_ || kind_ == StrategyKind::Ddp) return;
  std::vector<int64_t> bounds(static_cast<size_t>(ranks()) + 1, n_);
  for (int r = 0; r < ranks(); ++r) bounds[static_cast<size_t>(r)] = shard_of(n_, r, ranks()).offset;
  muon_parts_ = muon_cut_parts(optimizer, layout_, bounds);
}

InnerOptimizer::Gather SiteStrategy::site_gather() {
  if (!coll_ || muon_parts_.empty()) return {};
  return [this](std::span<float> full) {
    for (const auto& p : muon_parts_)
      coll_->broadcast(full.subspan(static_cast<size_t>(p.offset), static_cast<size_t>(p.count)), p.root);
  };
}

std::span<float> SiteStrategy::shard_params() {
  require_host("shard_params");
  if (kind_ == StrategyKind::Fsdp) return params_;
  if (kind_ == StrategyKind::Hybrid) return own_held();
  return std::span<float>(params_).subspan(static_cast<size_t>(shard_.offset), static_cast<size_t>(shard_.count));
}

void SiteStrategy::shard_updated() {
  if (kind_ == StrategyKind::Hybrid) return share_own_shard();
  if (kind_ == StrategyKind::Fsdp || !coll_) return;
  coll_->all_gather(shard_params(), params_);
}

std::span<const float> SiteStrategy::full_params() {
  require_host("full_params");
  if (kind_ == StrategyKind::Hybrid) {
    gather_held();
    return gathered_;
  }
  if (kind_ != StrategyKind::Fsdp) return params_;
  gathered_.assign(static_cast<size_t>(n_), 0.0f);
  std::copy(params_.begin(), params_.end(), gathered_.begin() + shard_.offset);
  if (coll_) coll_->all_gather(params_, gathered_);
  return gathered_;
}

void SiteStrategy::release_full_params() {
  if (kind_ == StrategyKind::Fsdp || kind_ == StrategyKind::Hybrid) std::vector<float>().swap(gathered_);
}

double SiteStrategy::site_mean(double v) {
  if (!coll_) return v;
  double buf[1] = {v};
  coll_->all_reduce_sum(std::span<double>(buf, 1));
  return buf[0] / ranks();
}

void SiteStrategy::site_sum(std::span<double> v) {
  if (coll_) coll_->all_reduce_sum(v);
}

OptimizerHostState SiteStrategy::optimizer_state() {
  require_host("optimizer_state");
  OptimizerHostState s;
  s.begin = opt_->begin();
  s.end = opt_->end();
  s.steps = opt_->steps();
  s.m = opt_->m();
  s.v = opt_->v();
  return s;
}

void SiteStrategy::load_optimizer(std::span<const float> m, std::span<const float> v, int64_t steps) {
  require_host("load_optimizer");
  GEOLOCO_CHECK(m.size() == opt_->m().size() && v.size() == opt_->v().size(),
                "optimizer state of {} floats, expected {}", m.size(), opt_->m().size());
  std::copy(m.begin(), m.end(), opt_->m().begin());
  std::copy(v.begin(), v.end(), opt_->v().begin());
  opt_->set_steps(steps);
}

nlohmann::json SiteStrategy::memory_json() const {
  const uint64_t f = sizeof(float);
  const uint64_t full = static_cast<uint64_t>(n_) * f, shard = static_cast<uint64_t>(shard_.count) * f;
  nlohmann::json j;
  j["strategy"] = strategy_name(kind_);
  j["rank"] = rank();
  j["ranks"] = ranks();
  j["shard_elements"] = shard_.count;
  // Persistent bytes held between steps.
  const bool sharded_grads =
      kind_ == StrategyKind::Zero2 || kind_ == StrategyKind::Fsdp || kind_ == StrategyKind::Hybrid;
  j["param_bytes"] = kind_ == StrategyKind::Fsdp     ? shard
                     : kind_ == StrategyKind::Hybrid ? static_cast<uint64_t>(hybrid_->held) * f
                                                     : full;
  j["grad_bytes"] = (kind_ == StrategyKind::Ddp || kind_ == StrategyKind::Zero1) ? full : 0;
  j["grad_shard_bytes"] = sharded_grads ? shard : 0;
  if (hybrid_) {
    j["group_size"] = hybrid_->group_size;
    j["groups"] = hybrid_->groups;
  }
  j["optimizer"] = optimizer_kind_name(opt_->config().kind);
  j["optimizer_bytes"] = static_cast<uint64_t>(opt_->m().size() + opt_->v().size()) * f;
  j["optimizer_scratch_bytes"] = opt_->scratch_bytes();  // Muon: the matrices' update buffer
  j["peak_transient_bytes"] = peak_transient_bytes_;
  return j;
}

}  // namespace geoloco::trainer

#include "trainer/optim/inner_optimizer.hpp"

#include <algorithm>
#include <cmath>

#include "core/error.hpp"

namespace geoloco::trainer {

OptimizerPlan plan_optimizer(const OptimizerConfig& cfg, const ParamLayout& layout, int64_t begin, int64_t end) {
  GEOLOCO_CHECK(0 <= begin && begin <= end && end <= layout.total(), "bad range [{}, {})", begin, end);
  OptimizerPlan p;
  if (cfg.kind == OptimizerKind::Muon)
    for (const auto& mm : muon_matrices(layout))
      if (mm.offset < end && mm.end() > begin) {
        p.muon.push_back(mm);
        p.needs_gather = p.needs_gather || mm.offset < begin || mm.end() > end;
      }
  auto is_muon = [&](int64_t offset) {
    return std::any_of(p.muon.begin(), p.muon.end(), [&](const MuonMatrix& mm) { return mm.offset == offset; });
  };
  for (const auto& view : layout.views()) {
    const int64_t b = std::max(begin, view.offset), e = std::min(end, view.offset + view.numel);
    if (b >= e) continue;
    const bool muon = is_muon(view.offset);
    if (!p.ranges.empty() && p.ranges.back().end == b && p.ranges.back().decay == view.decay() &&
        p.ranges.back().muon == muon)
      p.ranges.back().end = e;
    else
      p.ranges.push_back({b, e, view.decay(), muon});
  }
  return p;
}

std::vector<GatherPart> muon_cut_parts(const OptimizerConfig& cfg, const ParamLayout& layout,
                                       std::span<const int64_t> bounds) {
  std::vector<GatherPart> out;
  const int ranks = static_cast<int>(bounds.size()) - 1;
  if (cfg.kind != OptimizerKind::Muon || ranks < 2) return out;
  GEOLOCO_CHECK(bounds.front() == 0 && bounds.back() == layout.total(), "muon_cut_parts: ranges do not tile [0, {})",
                layout.total());
  for (const auto& mm : muon_matrices(layout)) {
    std::vector<GatherPart> parts;
    for (int r = 0; r < ranks; ++r) {
      const int64_t b = std::max(bounds[static_cast<size_t>(r)], mm.offset);
      const int64_t e = std::min(bounds[static_cast<size_t>(r) + 1], mm.end());
      if (b < e) parts.push_back({b, e - b, r});
    }
    if (parts.size() > 1) out.insert(out.end(), parts.begin(), parts.end());
  }
  return out;
}

InnerOptimizer::InnerOptimizer(const OptimizerConfig& cfg, const ParamLayout& layout, int64_t begin, int64_t end)
    : cfg_(cfg), begin_(begin), end_(end), total_(layout.total()) {
  OptimizerPlan p = plan_optimizer(cfg, layout, begin, end);
  ranges_ = std::move(p.ranges);
  muon_ = std::move(p.muon);
  needs_gather_ = p.needs_gather;
  m_.assign(static_cast<size_t>(end - begin), 0.0f);
  v_.assign(static_cast<size_t>(end - begin), 0.0f);
}

void InnerOptimizer::reset() {
  std::fill(m_.begin(), m_.end(), 0.0f);
  std::fill(v_.begin(), v_.end(), 0.0f);
  t_ = 0;
}

void InnerOptimizer::step(std::span<float> params, std::span<const float> grads, double lr, const Gather& gather) {
  GEOLOCO_CHECK(static_cast<int64_t>(params.size()) >= end_ && static_cast<int64_t>(grads.size()) >= end_,
                "optimizer buffers smaller than its range end {}", end_);
  update(params.data() + begin_, grads.data() + begin_, lr, gather);
}

void InnerOptimizer::step_shard(std::span<float> params, std::span<const float> grads, double lr,
                                const Gather& gather) {
  GEOLOCO_CHECK(
      static_cast<int64_t>(params.size()) == end_ - begin_ && static_cast<int64_t>(grads.size()) == end_ - begin_,
      "optimizer shard buffers must hold exactly {} elements", end_ - begin_);
  update(params.data(), grads.data(), lr, gather);
}

void InnerOptimizer::update(float* p_at_begin, const float* g_at_begin, double lr, const Gather& gather) {
  ++t_;
  const float b1 = static_cast<float>(cfg_.beta1), b2 = static_cast<float>(cfg_.beta2);
  const float bc1 = static_cast<float>(1.0 - std::pow(cfg_.beta1, static_cast<double>(t_)));
  const float bc2 = static_cast<float>(1.0 - std::pow(cfg_.beta2, static_cast<double>(t_)));
  const float flr = static_cast<float>(lr), eps = static_cast<float>(cfg_.eps);
  const float decay_keep = static_cast<float>(1.0 - lr * cfg_.weight_decay);
  float* __restrict p = p_at_begin;
  const float* __restrict g = g_at_begin;
  float* __restrict m = m_.data();
  float* __restrict v = v_.data();
  const bool muon = cfg_.kind == OptimizerKind::Muon;
  const bool gathering = muon && gather;
  GEOLOCO_CHECK(!needs_gather_ || gathering, "Muon: the range [{}, {}) cuts a matrix and no gather was given", begin_,
                end_);
  if (muon && update_.empty()) update_.assign(static_cast<size_t>(total_), 0.0f);
  const float mu = static_cast<float>(cfg_.muon.momentum), one_mu = 1.0f - mu;
  const bool nesterov = cfg_.muon.nesterov;
  for (const auto& r : ranges_) {
    const int64_t lo = r.begin - begin_, hi = r.end - begin_;
    if (r.muon) {
      float* __restrict u = update_.data() + begin_;
#pragma omp parallel for simd schedule(static)
      for (int64_t i = lo; i < hi; ++i) {
        const float mi = mu * m[i] + one_mu * g[i];
        m[i] = mi;
        u[i] = nesterov ? one_mu * g[i] + mu * mi : mi;
      }
      continue;
    }
    const float keep = r.decay ? decay_keep : 1.0f;
#pragma omp parallel for simd schedule(static)
    for (int64_t i = lo; i < hi; ++i) {
      float gi = g[i];
      float mi = b1 * m[i] + (1.0f - b1) * gi;
      float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
      m[i] = mi;
      v[i] = vi;
      float mhat = mi / bc1;
      float vhat = vi / bc2;
      p[i] = p[i] * keep - flr * mhat / (std::sqrt(vhat) + eps);
    }
  }
  if (!muon) return;
  if (gathering) gather(update_);
  const double mlr = cfg_.muon_lr(lr);
  const float muon_keep = static_cast<float>(1.0 - mlr * cfg_.weight_decay);
  for (const auto& mm : muon_) {
    std::span<float> x(update_.data() + mm.offset, static_cast<size_t>(mm.rows * mm.cols));
    newton_schulz(x, mm.rows, mm.cols, cfg_.muon.ns_steps, ns_scratch_);
    const float step = static_cast<float>(mlr) * muon_scale(mm.rows, mm.cols, cfg_.muon.scale);
    const int64_t lo = std::max(begin_, mm.offset), hi = std::min(end_, mm.end());
    const float* __restrict o = update_.data();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = lo; i < hi; ++i) p[i - begin_] = p[i - begin_] * muon_keep - step * o[i];
  }
}

}  // namespace geoloco::trainer

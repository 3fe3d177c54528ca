#include "trainer/optim/adamw.hpp"

#include <algorithm>
#include <cmath>

#include "trainer/core/error.hpp"

namespace geoloco::trainer {

AdamWConfig AdamWConfig::from_yaml(const config::Node& n) {
  AdamWConfig c;
  n.get_choice("kind", "adamw", {"adamw"});
  c.lr = n.get_double("lr", c.lr, 0.0, 10.0);
  if (n.has("betas")) {
    auto b = n.get<std::vector<double>>("betas", {});
    if (b.size() != 2 || !(b[0] >= 0 && b[0] < 1) || !(b[1] >= 0 && b[1] < 1))
      n.fail_value("betas", "a list of two numbers in [0, 1), e.g. [0.9, 0.95]");
    c.beta1 = b[0];
    c.beta2 = b[1];
  }
  c.eps = n.get_double("eps", c.eps, 0.0, 1.0);
  c.weight_decay = n.get_double("weight_decay", c.weight_decay, 0.0, 10.0);
  n.finish();
  return c;
}

AdamW::AdamW(const AdamWConfig& cfg, const ParamLayout& layout, int64_t begin, int64_t end)
    : cfg_(cfg), begin_(begin), end_(end) {
  GEOLOCO_CHECK(0 <= begin && begin <= end && end <= layout.total(), "bad range [{}, {})", begin, end);
  m_.assign(static_cast<size_t>(end - begin), 0.0f);
  v_.assign(static_cast<size_t>(end - begin), 0.0f);
  for (const auto& view : layout.views()) {
    int64_t b = std::max(begin, view.offset), e = std::min(end, view.offset + view.numel);
    if (b >= e) continue;
    if (!ranges_.empty() && ranges_.back().end == b && ranges_.back().decay == view.decay())
      ranges_.back().end = e;
    else
      ranges_.push_back({b, e, view.decay()});
  }
}

void AdamW::reset() {
  std::fill(m_.begin(), m_.end(), 0.0f);
  std::fill(v_.begin(), v_.end(), 0.0f);
  t_ = 0;
}

void AdamW::step(std::span<float> params, std::span<const float> grads, double lr) {
  GEOLOCO_CHECK(static_cast<int64_t>(params.size()) >= end_ && static_cast<int64_t>(grads.size()) >= end_,
                "AdamW buffers smaller than its range end {}", end_);
  update(params.data() + begin_, grads.data() + begin_, lr);
}

void AdamW::step_shard(std::span<float> params, std::span<const float> grads, double lr) {
  GEOLOCO_CHECK(static_cast<int64_t>(params.size()) == end_ - begin_ && static_cast<int64_t>(grads.size()) == end_ - begin_,
                "AdamW shard buffers must hold exactly {} elements", end_ - begin_);
  update(params.data(), grads.data(), lr);
}

void AdamW::update(float* p_at_begin, const float* g_at_begin, double lr) {
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
  for (const auto& r : ranges_) {
    const float keep = r.decay ? decay_keep : 1.0f;
    const int64_t lo = r.begin - begin_, hi = r.end - begin_;
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
}

}  // namespace geoloco::trainer

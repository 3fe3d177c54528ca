#include "trainer/cuda/cuda_adamw.hpp"

#include "trainer/cuda/adamw_kernel.hpp"

#include <algorithm>
#include <cmath>

namespace geoloco::cuda {


CudaAdamW::CudaAdamW(const trainer::AdamWConfig& cfg, const trainer::ParamLayout& layout, int64_t begin, int64_t end)
    : cfg_(cfg), begin_(begin), end_(end) {
  GEOLOCO_CHECK(0 <= begin && begin <= end && end <= layout.total(), "bad range [{}, {})", begin, end);
  m_ = DeviceBuffer<float>(size_t(end - begin), "AdamW m");
  v_ = DeviceBuffer<float>(size_t(end - begin), "AdamW v");
  for (const auto& view : layout.views()) {
    const int64_t b = std::max(begin, view.offset), e = std::min(end, view.offset + view.numel);
    if (b >= e) continue;
    if (!ranges_.empty() && ranges_.back().end == b && ranges_.back().decay == view.decay())
      ranges_.back().end = e;
    else
      ranges_.push_back({b, e, view.decay()});
  }
  if (end > begin) {
    check_cuda(cudaMemset(m_.data(), 0, m_.size() * sizeof(float)), "AdamW zero m");
    check_cuda(cudaMemset(v_.data(), 0, v_.size() * sizeof(float)), "AdamW zero v");
    // cudaMemset runs on the legacy stream; step() runs on the caller's (possibly
    // non-blocking) stream, which would not wait for it.
    check_cuda(cudaDeviceSynchronize(), "AdamW zero moments");
  }
}

void CudaAdamW::reset(cudaStream_t s) {
  if (end_ > begin_) {
    check_cuda(cudaMemsetAsync(m_.data(), 0, m_.size() * sizeof(float), s), "AdamW reset m");
    check_cuda(cudaMemsetAsync(v_.data(), 0, v_.size() * sizeof(float), s), "AdamW reset v");
  }
  t_ = 0;
}

void CudaAdamW::step(std::span<float> params, std::span<const float> grads, double lr, cudaStream_t s) {
  GEOLOCO_CHECK(static_cast<int64_t>(params.size()) >= end_ && static_cast<int64_t>(grads.size()) >= end_,
                "AdamW buffers smaller than its range end {}", end_);
  update(params.data() + begin_, grads.data() + begin_, lr, s);
}

void CudaAdamW::step_shard(std::span<float> params, std::span<const float> grads, double lr, cudaStream_t s) {
  GEOLOCO_CHECK(static_cast<int64_t>(params.size()) == end_ - begin_ &&
                    static_cast<int64_t>(grads.size()) == end_ - begin_,
                "AdamW shard buffers must hold exactly {} elements", end_ - begin_);
  update(params.data(), grads.data(), lr, s);
}

void CudaAdamW::update(float* p, const float* g, double lr, cudaStream_t s) {
  ++t_;
  const float b1 = static_cast<float>(cfg_.beta1), b2 = static_cast<float>(cfg_.beta2);
  const float bc1 = static_cast<float>(1.0 - std::pow(cfg_.beta1, static_cast<double>(t_)));
  const float bc2 = static_cast<float>(1.0 - std::pow(cfg_.beta2, static_cast<double>(t_)));
  const float flr = static_cast<float>(lr), eps = static_cast<float>(cfg_.eps);
  const float decay_keep = static_cast<float>(1.0 - lr * cfg_.weight_decay);
  for (const auto& r : ranges_) {
    const int64_t lo = r.begin - begin_, hi = r.end - begin_;
    const unsigned grid = static_cast<unsigned>(std::clamp<int64_t>((hi - lo + 255) / 256, 1, 65536));
    // p and g point at element begin_, m and v at their own element 0: same local index.
    launch_adamw(grid, s, p, g, m_.data(), v_.data(), lo, hi, b1, b2, bc1, bc2, flr, eps, r.decay ? decay_keep : 1.0f);
    check_launch("AdamW step");
  }
}

void CudaAdamW::download(std::vector<float>& m, std::vector<float>& v) const {
  m.resize(m_.size());
  v.resize(v_.size());
  if (m_.size() == 0) return;
  check_cuda(cudaMemcpy(m.data(), m_.data(), m_.size() * sizeof(float), cudaMemcpyDeviceToHost), "AdamW download m");
  check_cuda(cudaMemcpy(v.data(), v_.data(), v_.size() * sizeof(float), cudaMemcpyDeviceToHost), "AdamW download v");
}

void CudaAdamW::upload(std::span<const float> m, std::span<const float> v) {
  GEOLOCO_CHECK(m.size() == m_.size() && v.size() == v_.size(), "AdamW upload: {} / {} moments for a range of {}",
                m.size(), v.size(), m_.size());
  if (m_.size() == 0) return;
  check_cuda(cudaMemcpy(m_.data(), m.data(), m.size() * sizeof(float), cudaMemcpyHostToDevice), "AdamW upload m");
  check_cuda(cudaMemcpy(v_.data(), v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice), "AdamW upload v");
  check_cuda(cudaDeviceSynchronize(), "AdamW upload");  // see the constructor
}

}  // namespace geoloco::cuda

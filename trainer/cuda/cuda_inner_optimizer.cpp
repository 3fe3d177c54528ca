#include "trainer/cuda/cuda_inner_optimizer.hpp"

#include "trainer/cuda/adamw_kernel.hpp"
#include "trainer/cuda/muon_kernel.hpp"
#include "trainer/cuda/ops.hpp"

#include <algorithm>
#include <cmath>

namespace geoloco::cuda {

CudaInnerOptimizer::CudaInnerOptimizer(const trainer::OptimizerConfig& cfg, const trainer::ParamLayout& layout,
                                       int64_t begin, int64_t end)
    : cfg_(cfg), begin_(begin), end_(end), total_(layout.total()) {
  GEOLOCO_CHECK(0 <= begin && begin <= end && end <= layout.total(), "bad range [{}, {})", begin, end);
  m_ = DeviceBuffer<float>(size_t(end - begin), "AdamW m");
  v_ = DeviceBuffer<float>(size_t(end - begin), "AdamW v");
  trainer::OptimizerPlan p = trainer::plan_optimizer(cfg_, layout, begin, end);
  ranges_ = std::move(p.ranges);
  muon_ = std::move(p.muon);
  needs_gather_ = p.needs_gather;
  if (end > begin) {
    check_cuda(cudaMemset(m_.data(), 0, m_.size() * sizeof(float)), "AdamW zero m");
    check_cuda(cudaMemset(v_.data(), 0, v_.size() * sizeof(float)), "AdamW zero v");
    // cudaMemset runs on the legacy stream; step() runs on the caller's (possibly
    // non-blocking) stream, which would not wait for it.
    check_cuda(cudaDeviceSynchronize(), "AdamW zero moments");
  }
}

void CudaInnerOptimizer::reset(cudaStream_t s) {
  if (end_ > begin_) {
    check_cuda(cudaMemsetAsync(m_.data(), 0, m_.size() * sizeof(float), s), "AdamW reset m");
    check_cuda(cudaMemsetAsync(v_.data(), 0, v_.size() * sizeof(float), s), "AdamW reset v");
  }
  t_ = 0;
}

void CudaInnerOptimizer::step(std::span<float> params, std::span<const float> grads, double lr, cudaStream_t s,
                              const Gather& gather) {
  GEOLOCO_CHECK(static_cast<int64_t>(params.size()) >= end_ && static_cast<int64_t>(grads.size()) >= end_,
                "optimizer buffers smaller than its range end {}", end_);
  update(params.data() + begin_, grads.data() + begin_, lr, s, gather);
}

void CudaInnerOptimizer::step_shard(std::span<float> params, std::span<const float> grads, double lr, cudaStream_t s,
                                    const Gather& gather) {
  GEOLOCO_CHECK(
      static_cast<int64_t>(params.size()) == end_ - begin_ && static_cast<int64_t>(grads.size()) == end_ - begin_,
      "optimizer shard buffers must hold exactly {} elements", end_ - begin_);
  update(params.data(), grads.data(), lr, s, gather);
}

namespace {
unsigned grid_of(int64_t n) { return static_cast<unsigned>(std::clamp<int64_t>((n + 255) / 256, 1, 65536)); }
}  // namespace

void CudaInnerOptimizer::newton_schulz(float* x, int64_t rows, int64_t cols, cudaStream_t s) {
  const bool wide = rows <= cols;
  const int64_t m = wide ? rows : cols, n = rows * cols;
  float* A = ns_.data();
  float* B = A + m * m;
  float* Y = B + m * m;
  OpContext ctx;
  ctx.stream = s;
  ctx.blas = blas_->get();
  ctx.work = work_.data();
  ctx.work_bytes = work_.size();
  const double sq = sum_squares_to_host(ctx, x, n);  // synchronises s
  launch_scaled_copy(grid_of(n), s, x, x, n, static_cast<float>(1.0 / (std::sqrt(sq) + 1e-7)));
  check_launch("Muon normalize");
  const int R = static_cast<int>(rows), C = static_cast<int>(cols), M = static_cast<int>(m);
  for (int it = 0; it < cfg_.muon.ns_steps; ++it) {
    if (wide)
      gemm(ctx, false, true, M, M, C, 1.0f, x, C, 0, x, C, 0, DType::F32, 0.0f, A, M, 0, DType::F32, 1, "Muon X X^T");
    else
      gemm(ctx, true, false, M, M, R, 1.0f, x, C, 0, x, C, 0, DType::F32, 0.0f, A, M, 0, DType::F32, 1, "Muon X^T X");
    check_cuda(cudaMemcpyAsync(B, A, size_t(m * m) * sizeof(float), cudaMemcpyDeviceToDevice, s), "Muon copy A");
    gemm(ctx, false, false, M, M, M, trainer::kNsC, A, M, 0, A, M, 0, DType::F32, trainer::kNsB, B, M, 0, DType::F32, 1,
         "Muon b A + c A A");
    launch_scaled_copy(grid_of(n), s, Y, x, n, trainer::kNsA);
    check_launch("Muon a X");
    if (wide)
      gemm(ctx, false, false, R, C, R, 1.0f, B, M, 0, x, C, 0, DType::F32, 1.0f, Y, C, 0, DType::F32, 1, "Muon B X");
    else
      gemm(ctx, false, false, R, C, C, 1.0f, x, C, 0, B, M, 0, DType::F32, 1.0f, Y, C, 0, DType::F32, 1, "Muon X B");
    check_cuda(cudaMemcpyAsync(x, Y, size_t(n) * sizeof(float), cudaMemcpyDeviceToDevice, s), "Muon copy Y");
  }
}

void CudaInnerOptimizer::update(float* p, const float* g, double lr, cudaStream_t s, const Gather& gather) {
  ++t_;
  const float b1 = static_cast<float>(cfg_.beta1), b2 = static_cast<float>(cfg_.beta2);
  const float bc1 = static_cast<float>(1.0 - std::pow(cfg_.beta1, static_cast<double>(t_)));
  const float bc2 = static_cast<float>(1.0 - std::pow(cfg_.beta2, static_cast<double>(t_)));
  const float flr = static_cast<float>(lr), eps = static_cast<float>(cfg_.eps);
  const float decay_keep = static_cast<float>(1.0 - lr * cfg_.weight_decay);
  const bool muon = cfg_.kind == trainer::OptimizerKind::Muon;
  const bool gathering = muon && gather;
  GEOLOCO_CHECK(!needs_gather_ || gathering, "Muon: the range [{}, {}) cuts a matrix and no gather was given", begin_,
                end_);
  if (muon && update_.size() == 0) {
    update_ = DeviceBuffer<float>(size_t(total_), "Muon updates");
    int64_t most = 0;
    for (const auto& mm : muon_) {
      const int64_t k = std::min(mm.rows, mm.cols);
      most = std::max(most, 2 * k * k + mm.rows * mm.cols);
    }
    ns_ = DeviceBuffer<float>(size_t(std::max<int64_t>(most, 1)), "Newton-Schulz scratch");
    work_ = DeviceBuffer<unsigned char>(size_t{1} << 16, "Muon norm scratch");
    blas_ = std::make_unique<CublasHandle>(s);
  }
  if (blas_) check_cublas(cublasSetStream(blas_->get(), s), "cublasSetStream (Muon)");
  for (const auto& r : ranges_) {
    const int64_t lo = r.begin - begin_, hi = r.end - begin_;
    const unsigned grid = grid_of(hi - lo);
    // p and g point at element begin_, m and v at their own element 0: same local index.
    if (r.muon) {
      launch_muon_momentum(grid, s, g, m_.data(), update_.data() + begin_, lo, hi,
                           static_cast<float>(cfg_.muon.momentum), cfg_.muon.nesterov);
      check_launch("Muon momentum");
      continue;
    }
    launch_adamw(grid, s, p, g, m_.data(), v_.data(), lo, hi, b1, b2, bc1, bc2, flr, eps, r.decay ? decay_keep : 1.0f);
    check_launch("AdamW step");
  }
  if (!muon) return;
  if (gathering) gather(update_.span());
  const double mlr = cfg_.muon_lr(lr);
  const float muon_keep = static_cast<float>(1.0 - mlr * cfg_.weight_decay);
  for (const auto& mm : muon_) {
    newton_schulz(update_.data() + mm.offset, mm.rows, mm.cols, s);
    const float step = static_cast<float>(mlr) * trainer::muon_scale(mm.rows, mm.cols, cfg_.muon.scale);
    const int64_t lo = std::max(begin_, mm.offset) - begin_, hi = std::min(end_, mm.end()) - begin_;
    launch_muon_apply(grid_of(hi - lo), s, p, update_.data() + begin_, lo, hi, muon_keep, step);
    check_launch("Muon apply");
  }
}

void CudaInnerOptimizer::download(std::vector<float>& m, std::vector<float>& v) const {
  m.resize(m_.size());
  v.resize(v_.size());
  if (m_.size() == 0) return;
  check_cuda(cudaMemcpy(m.data(), m_.data(), m_.size() * sizeof(float), cudaMemcpyDeviceToHost), "AdamW download m");
  check_cuda(cudaMemcpy(v.data(), v_.data(), v_.size() * sizeof(float), cudaMemcpyDeviceToHost), "AdamW download v");
}

void CudaInnerOptimizer::upload(std::span<const float> m, std::span<const float> v) {
  GEOLOCO_CHECK(m.size() == m_.size() && v.size() == v_.size(), "AdamW upload: {} / {} moments for a range of {}",
                m.size(), v.size(), m_.size());
  if (m_.size() == 0) return;
  check_cuda(cudaMemcpy(m_.data(), m.data(), m.size() * sizeof(float), cudaMemcpyHostToDevice), "AdamW upload m");
  check_cuda(cudaMemcpy(v_.data(), v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice), "AdamW upload v");
  check_cuda(cudaDeviceSynchronize(), "AdamW upload");  // see the constructor
}

}  // namespace geoloco::cuda

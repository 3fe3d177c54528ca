// The site strategies on one GPU per rank: parameters, gradients and optimizer state on the
// device, NCCL collectives, the host mirror the outer loop reads (cuda_site_strategy.hpp).
#include "trainer/loop/cuda_site_strategy.hpp"

#include <fmt/format.h>

#include <cmath>

#include "core/error.hpp"
#include "trainer/cuda/cuda_check.hpp"
#include "trainer/cuda/precision.hpp"

namespace geoloco::trainer {

namespace {

constexpr size_t kWorkBytes = size_t{1} << 20;  // norm reduction scratch (a few KiB used)

// H2D from pageable memory may return before the DMA is done, and the model's stream does not
// wait for the legacy stream: synchronise the device after plain copies.
void copy_to_device(float* dst, const float* src, size_t n, const char* what) {
  if (n == 0) return;
  cuda::check_cuda(cudaMemcpy(dst, src, n * sizeof(float), cudaMemcpyHostToDevice), what);
  cuda::check_cuda(cudaDeviceSynchronize(), what);
}

}  // namespace

bool built_with_cuda() { return true; }

CudaSiteStrategy::CudaSiteStrategy(const RunConfig& cfg, int site, const ParamLayout& layout,
                                   parallel::Collective* coll, std::span<const float> initial, int device,
                                   bool keep_one_rank_collective)
    : SiteStrategy(parse_strategy(cfg.sites.at(static_cast<size_t>(site)).strategy), layout, coll, cfg.train.optimizer,
                   NoHostState{keep_one_rank_collective, cfg.sites.at(static_cast<size_t>(site)).group_size}),
      device_(device),
      info_((cuda::check_cuda(cudaSetDevice(device), fmt::format("cudaSetDevice({})", device)),
             cuda::device_info(device))),
      precision_(cfg.train.precision),
      plan_(plan_device_buffers(kind(), layout.total(), rank(), ranks(),
                                cfg.sites.at(static_cast<size_t>(site)).group_size)),
      model_(cfg.model, cuda::parse_precision(cfg.train.precision), cuda::parse_attention_kernel(cfg.train.attention),
             cfg.train.micro_batch),
      d_params_(static_cast<size_t>(plan_.param_elems), "parameters"),
      d_grad_shard_(static_cast<size_t>(plan_.grad_shard_elems), "gradient shard"),
      d_grads_(plan_.grads_persistent ? static_cast<size_t>(plan_.grad_elems) : 0, model_.stream(), "gradients"),
      d_scalars_(8, "site scalars"),
      d_work_(kWorkBytes, "norm scratch"),
      adam_(cfg.train.optimizer, layout, plan_.opt_begin, plan_.opt_end),
      mirror_(static_cast<size_t>(plan_.mirror_elems)) {
  GEOLOCO_CHECK(static_cast<int64_t>(initial.size()) == layout.total(), "initial params: {} != {}", initial.size(),
                layout.total());
  if (collective() && collective()->memory() != parallel::MemorySpace::kCuda)
    throw ConfigError(fmt::format("site.device: cuda needs a device collective (NCCL) for {} ranks; got {}", ranks(),
                                  collective()->backend()));
  backend_ = collective() ? collective()->backend() : "none";
  cuda::keep_pool_memory(device_);
  if (const auto* h = hybrid()) {
    for (int g = 0; g < h->groups; ++g) {
      const auto p = h->pieces[static_cast<size_t>(g)];
      copy_to_device(d_params_.data() + h->held_offset[static_cast<size_t>(g)], initial.data() + p.offset,
                     static_cast<size_t>(p.count), "upload initial parameters (hybrid pieces)");
    }
  } else {
    const size_t off = kind() == StrategyKind::Fsdp ? static_cast<size_t>(shard().offset) : 0;
    copy_to_device(d_params_.data(), initial.data() + off, d_params_.size(), "upload initial parameters");
  }
  if (plan_.overlap && d_grads_.size() > 0)
    overlap_ = std::make_unique<cuda::OverlappedAllReduce>(*collective(), this->layout(), d_grads_.span());
}

CudaSiteStrategy::~CudaSiteStrategy() {
  // Nothing may still write into buffers that are about to be freed.
  (void)cudaStreamSynchronize(model_.stream());
}

cuda::OpContext CudaSiteStrategy::ops() const {
  cuda::OpContext c;
  c.stream = model_.stream();
  c.work = const_cast<unsigned char*>(d_work_.data());
  c.work_bytes = d_work_.size();
  return c;
}

void CudaSiteStrategy::sync_compute() {
  cuda::check_cuda(cudaStreamSynchronize(model_.stream()), "synchronise the model stream");
}

std::span<float> CudaSiteStrategy::shard_on_device() {
  if (kind() == StrategyKind::Fsdp) return d_params_.span();
  if (const auto* h = hybrid())
    return d_params_.span().subspan(static_cast<size_t>(h->own_held_offset()), static_cast<size_t>(h->own.count));
  return d_params_.span().subspan(static_cast<size_t>(shard().offset), static_cast<size_t>(shard().count));
}

void CudaSiteStrategy::gather_full() {
  const size_t n = static_cast<size_t>(num_params());
  if (d_gathered_.size() != n)
    d_gathered_ = cuda::StreamBuffer<float>(n, model_.stream(), "gathered parameters (fsdp)");
  if (hybrid()) {
    held_into_full(d_params_.data(), d_gathered_.span());
    return;
  }
  auto mine = d_gathered_.span().subspan(static_cast<size_t>(shard().offset), static_cast<size_t>(shard().count));
  if (!mine.empty())
    cuda::check_cuda(
        cudaMemcpyAsync(mine.data(), d_params_.data(), mine.size_bytes(), cudaMemcpyDeviceToDevice, model_.stream()),
        "fsdp: own shard into the gathered buffer");
  sync_compute();
  if (collective()) collective()->all_gather(mine, d_gathered_.span());
}

std::span<const float> CudaSiteStrategy::full_on_device() const {
  return gathers() ? d_gathered_.span() : d_params_.span();
}

double CudaSiteStrategy::forward_backward(const NextBatch& next, int B, int T, int K) {
  const size_t n = static_cast<size_t>(num_params());
  if (d_grads_.size() != n) d_grads_ = cuda::StreamBuffer<float>(n, model_.stream(), "gradients");
  cuda::check_cuda(cudaMemsetAsync(d_grads_.data(), 0, n * sizeof(float), model_.stream()), "zero the gradients");
  if (gathers()) gather_full();
  const auto params = full_on_device();
  std::vector<int32_t> x(static_cast<size_t>(B) * T), y(x.size());
  double loss = 0;
  for (int k = 0; k < K; ++k) {
    next(x.data(), y.data());
    loss += model_.forward(params, x.data(), y.data(), B, T);
    const bool last = k == K - 1;
    model_.backward(params, d_grads_.span(), 1.0f / static_cast<float>(K),
                    last && overlap_ ? overlap_->hook() : cuda::GradReadyHook{});
  }
  peak_activation_bytes_ = std::max(peak_activation_bytes_, model_.device_bytes());
  return loss / K;
}

void CudaSiteStrategy::held_into_full(const float* held, std::span<float> full) {
  const auto& h = *hybrid();
  for (int g = 0; g < h.groups; ++g) {
    const auto p = h.pieces[static_cast<size_t>(g)];
    if (p.count > 0)
      cuda::check_cuda(
          cudaMemcpyAsync(full.data() + p.offset, held + h.held_offset[static_cast<size_t>(g)],
                          static_cast<size_t>(p.count) * sizeof(float), cudaMemcpyDeviceToDevice, model_.stream()),
          "hybrid: held piece into place");
  }
  sync_compute();
  if (auto* group = group_collective())
    for (int g = 0; g < h.groups; ++g) {
      const auto p = h.pieces[static_cast<size_t>(g)];
      const auto b = h.blocks[static_cast<size_t>(g)];
      group->all_gather(full.subspan(static_cast<size_t>(p.offset), static_cast<size_t>(p.count)),
                        full.subspan(static_cast<size_t>(b.offset), static_cast<size_t>(b.count)));
    }
}

cuda::CudaInnerOptimizer::Gather CudaSiteStrategy::device_gather() {
  auto* coll = collective();
  if (!coll || muon_parts().empty()) return {};
  return [this, coll](std::span<float> full) {
    sync_compute();
    for (const auto& p : muon_parts())
      coll->broadcast(full.subspan(static_cast<size_t>(p.offset), static_cast<size_t>(p.count)), p.root);
  };
}

void CudaSiteStrategy::clip(std::span<float> g, StepResult& r, double max_norm) {
  r.clip_scale = 1.0f;
  if (max_norm <= 0.0 || r.grad_norm <= max_norm) return;
  r.clip_scale = static_cast<float>(max_norm / (r.grad_norm + 1e-6));  // grad_clip.cpp's formula
  cuda::scale_inplace(ops(), g.data(), static_cast<int64_t>(g.size()), r.clip_scale);
}

void CudaSiteStrategy::clip_sharded(std::span<float> gs, StepResult& r, double max_norm) {
  double sq = cuda::sum_squares_to_host(ops(), gs.data(), static_cast<int64_t>(gs.size()));
  site_sum(std::span<double>(&sq, 1));
  r.grad_norm = std::sqrt(sq);
  clip(gs, r, max_norm);
}

void CudaSiteStrategy::share_own_shard() {
  if (auto* replicas = replica_collective()) replicas->all_gather(shard_on_device(), d_params_.span());
}

void CudaSiteStrategy::apply_pending_reset() {
  // The outer loop reset the proxy (inner_state: reset): the device moments follow.
  if (optimizer().steps() != adam_.steps()) {
    adam_.reset(model_.stream());
    adam_.set_steps(optimizer().steps());
  }
}

StepResult CudaSiteStrategy::finish_hybrid_step(double lr, double max_norm) {
  const auto& h = *hybrid();
  StepResult r;
  const auto o = ops();
  auto gs = d_grad_shard_.span();
  // 1. Inside the group: each block's gradient reduce-scattered into the held pieces.
  {
    cuda::StreamBuffer<float> held(static_cast<size_t>(h.held), model_.stream(), "hybrid: held gradient pieces");
    sync_compute();
    for (int g = 0; g < h.groups; ++g) {
      const auto p = h.pieces[static_cast<size_t>(g)];
      const auto b = h.blocks[static_cast<size_t>(g)];
      auto out =
          held.span().subspan(static_cast<size_t>(h.held_offset[static_cast<size_t>(g)]), static_cast<size_t>(p.count));
      if (auto* group = group_collective()) {
        group->reduce_scatter_sum(d_grads_.span().subspan(static_cast<size_t>(b.offset), static_cast<size_t>(b.count)),
                                  out);
      } else if (!out.empty()) {
        cuda::check_cuda(cudaMemcpyAsync(out.data(), d_grads_.data() + p.offset, out.size_bytes(),
                                         cudaMemcpyDeviceToDevice, model_.stream()),
                         "hybrid: gradient piece copy");
      }
    }
    sync_compute();
    d_grads_.reset();
    // 2. Over the replica set: the group sums of the own shard summed over the groups.
    if (auto* replicas = replica_collective()) {
      replicas->reduce_scatter_sum(held.span(), gs);
    } else if (!gs.empty()) {
      cuda::check_cuda(cudaMemcpyAsync(gs.data(), held.data() + h.own_held_offset(), gs.size_bytes(),
                                       cudaMemcpyDeviceToDevice, model_.stream()),
                       "hybrid: gradient shard copy");
    }
    sync_compute();
  }
  if (collective())
    cuda::scale_inplace(o, gs.data(), static_cast<int64_t>(gs.size()), 1.0f / static_cast<float>(ranks()));
  clip_sharded(gs, r, max_norm);
  adam_.step_shard(shard_on_device(), gs, lr, model_.stream(), device_gather());
  sync_compute();
  share_own_shard();
  d_gathered_.reset();
  optimizer().set_steps(adam_.steps());
  sync_compute();
  return r;
}

StepResult CudaSiteStrategy::finish_step(double lr, double max_norm) {
  GEOLOCO_CHECK(d_grads_.size() == static_cast<size_t>(num_params()), "finish_step without forward_backward");
  apply_pending_reset();
  if (kind() == StrategyKind::Hybrid) return finish_hybrid_step(lr, max_norm);
  StepResult r;
  auto* coll = collective();
  const float inv = 1.0f / static_cast<float>(ranks());
  const auto o = ops();
  switch (kind()) {
    case StrategyKind::Ddp:
    case StrategyKind::Zero1: {
      auto g = d_grads_.span();
      if (coll) {
        if (overlap_) {
          overlap_->wait();
        } else {
          sync_compute();
          coll->all_reduce_sum(g);
        }
        cuda::scale_inplace(o, g.data(), static_cast<int64_t>(g.size()), inv);
      }
      r.grad_norm = std::sqrt(cuda::sum_squares_to_host(o, g.data(), static_cast<int64_t>(g.size())));
      clip(g, r, max_norm);
      adam_.step(d_params_.span(), g, lr, model_.stream(), device_gather());  // zero1: only the shard's range
      if (kind() == StrategyKind::Zero1 && coll) {
        sync_compute();
        coll->all_gather(shard_on_device(), d_params_.span());
      }
      break;
    }
    case StrategyKind::Zero2:
    case StrategyKind::Fsdp: {
      auto gs = d_grad_shard_.span();
      if (coll) {
        sync_compute();
        coll->reduce_scatter_sum(d_grads_.span(), gs);
        cuda::scale_inplace(o, gs.data(), static_cast<int64_t>(gs.size()), inv);
      } else if (!gs.empty()) {
        cuda::check_cuda(cudaMemcpyAsync(gs.data(), d_grads_.data() + shard().offset, gs.size_bytes(),
                                         cudaMemcpyDeviceToDevice, model_.stream()),
                         "gradient shard copy");
      }
      // The full gradient is no longer needed: release it before the update.
      sync_compute();
      d_grads_.reset();
      clip_sharded(gs, r, max_norm);
      if (kind() == StrategyKind::Zero2) {
        adam_.step_shard(shard_on_device(), gs, lr, model_.stream(), device_gather());
        if (coll) {
          sync_compute();
          coll->all_gather(shard_on_device(), d_params_.span());
        }
      } else {
        adam_.step_shard(d_params_.span(), gs, lr, model_.stream(), device_gather());
        sync_compute();
        d_gathered_.reset();
      }
      break;
    }
    case StrategyKind::Hybrid: break;  // finish_hybrid_step
  }
  optimizer().set_steps(adam_.steps());
  sync_compute();
  return r;
}

void CudaSiteStrategy::begin_eval() {
  if (gathers()) gather_full();
}

double CudaSiteStrategy::eval_batch(const int32_t* inputs, const int32_t* targets, int rows, int T) {
  return model_.evaluate(full_on_device(), inputs, targets, rows, T);
}

void CudaSiteStrategy::end_eval() {
  if (gathers()) {
    sync_compute();
    d_gathered_.reset();
  }
}

std::span<float> CudaSiteStrategy::shard_params() {
  auto dev = shard_on_device();
  mirror_.download_async(dev, model_.stream());
  const auto h = mirror_.wait();
  return mirror_.pinned().first(h.size());
}

void CudaSiteStrategy::shard_updated() {
  auto dev = shard_on_device();
  mirror_.upload_async(mirror_.pinned().first(dev.size()), dev, model_.stream());
  sync_compute();  // the model stream waits for the upload; collectives run on their own stream
  share_shard();
}

outer::DeviceOuter* CudaSiteStrategy::device_outer() {
  if (!outer_stage_)
    outer_stage_ = std::make_unique<CudaOuterStage>([this] { return shard_on_device(); }, model_.stream(),
                                                    [this] { share_shard(); });
  return outer_stage_.get();
}

void CudaSiteStrategy::share_shard() {
  auto dev = shard_on_device();
  if (kind() == StrategyKind::Hybrid) {
    share_own_shard();
  } else if (kind() != StrategyKind::Fsdp && collective()) {
    collective()->all_gather(dev, d_params_.span());
  }
}

std::span<const float> CudaSiteStrategy::full_params() {
  const bool fsdp = gathers();
  const bool had_gathered = d_gathered_.size() > 0;
  if (fsdp) gather_full();
  sync_compute();
  const auto src = full_on_device();
  host_full_.resize(src.size());
  cuda::check_cuda(cudaMemcpy(host_full_.data(), src.data(), src.size_bytes(), cudaMemcpyDeviceToHost),
                   "download the full parameters");
  if (fsdp && !had_gathered) d_gathered_.reset();
  return host_full_;
}

OptimizerHostState CudaSiteStrategy::optimizer_state() {
  sync_compute();
  OptimizerHostState s;
  s.begin = adam_.begin();
  s.end = adam_.end();
  s.steps = adam_.steps();
  adam_.download(s.m_copy, s.v_copy);
  s.m = s.m_copy;
  s.v = s.v_copy;
  return s;
}

void CudaSiteStrategy::load_optimizer(std::span<const float> m, std::span<const float> v, int64_t steps) {
  sync_compute();
  adam_.upload(m, v);
  adam_.set_steps(steps);
  optimizer().set_steps(steps);
}

void CudaSiteStrategy::site_sum(std::span<double> v) {
  auto* coll = collective();
  if (!coll || v.empty()) return;
  if (d_scalars_.size() < v.size()) d_scalars_ = cuda::DeviceBuffer<double>(v.size(), "site scalars");
  auto d = d_scalars_.span().first(v.size());
  cuda::check_cuda(cudaMemcpy(d.data(), v.data(), v.size_bytes(), cudaMemcpyHostToDevice), "site scalars upload");
  cuda::check_cuda(cudaDeviceSynchronize(), "site scalars upload");
  coll->all_reduce_sum(d);
  cuda::check_cuda(cudaMemcpy(v.data(), d.data(), v.size_bytes(), cudaMemcpyDeviceToHost), "site scalars download");
}

double CudaSiteStrategy::site_mean(double v) {
  double buf[1] = {v};
  site_sum(std::span<double>(buf, 1));
  return buf[0] / ranks();
}

nlohmann::json CudaSiteStrategy::memory_json() const {
  nlohmann::json j = plan_.to_json();
  j["strategy"] = strategy_name(kind());
  j["rank"] = rank();
  j["ranks"] = ranks();
  j["shard_elements"] = shard().count;
  j["device"] = device_;
  j["model_device_bytes"] = peak_activation_bytes_;
  j["optimizer"] = optimizer_kind_name(adam_.config().kind);
  j["optimizer_scratch_bytes"] = adam_.scratch_bytes();  // Muon: the matrices' update buffer
  if (const auto* h = hybrid()) {
    j["group_size"] = h->group_size;
    j["groups"] = h->groups;
  }
  return j;
}

nlohmann::json CudaSiteStrategy::describe() const {
  return {{"device", fmt::format("cuda:{}", device_)},
          {"name", info_.name},
          {"sm", fmt::format("{}{}", info_.sm_major, info_.sm_minor)},
          {"precision", precision_},
          {"attention", model_.fused_attention() ? "fused" : "materialized"},
          {"strategy", strategy_name(kind())},
          {"collective", backend_},
          {"grad_overlap", plan_.overlap}};
}

std::unique_ptr<DeviceSite> make_device_site(const RunConfig& cfg, int site, const ParamLayout& layout,
                                             parallel::Collective* coll, std::span<const float> initial,
                                             const DeviceSiteOptions& opts) {
  GEOLOCO_CHECK(opts.device >= 0, "make_device_site: no device selected");
  return std::make_unique<CudaSiteStrategy>(cfg, site, layout, coll, initial, opts.device,
                                            opts.keep_one_rank_collective);
}

// The GPU of (site, rank): the local rank among every rank of the config on the same host.
int select_rank_device(const RunConfig& cfg, int site, int rank, int requested) {
  const LocalRank lr = local_rank_of(cfg, site, rank);
  const std::string who = fmt::format("site {} rank {}", cfg.sites.at(static_cast<size_t>(site)).name, rank);
  try {
    return cuda::select_device(lr.rank, lr.ranks, requested).index;
  } catch (const cuda::CudaError& e) {
    const std::string msg = fmt::format("{}: site.device: cuda, but {}", who, e.what());
    switch (e.kind()) {
      case cuda::CudaErrorKind::NoDevice: throw cuda::CudaNoDevice(e.kind(), e.op(), e.device(), e.code(), msg);
      case cuda::CudaErrorKind::OutOfMemory: throw cuda::CudaOutOfMemory(e.kind(), e.op(), e.device(), e.code(), msg);
      case cuda::CudaErrorKind::ArchMismatch: throw cuda::CudaArchMismatch(e.kind(), e.op(), e.device(), e.code(), msg);
      case cuda::CudaErrorKind::Other: throw cuda::CudaError(e.kind(), e.op(), e.device(), e.code(), msg);
    }
    throw;
  } catch (const ConfigError& e) {
    throw ConfigError(fmt::format("{}: {}", who, e.what()));
  }
}

}  // namespace geoloco::trainer

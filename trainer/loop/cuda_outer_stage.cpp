// The outer loop's device side on a CUDA site (cuda_outer_stage.hpp).
#include "trainer/loop/cuda_outer_stage.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.hpp"
#include "trainer/cuda/cuda_check.hpp"
#include "trainer/cuda/quantize_kernel.hpp"

namespace geoloco::trainer {

namespace {

cuda::QuantCodec quant_codec(compression::Codec c) {
  switch (c) {
    case compression::Codec::kInt8: return cuda::QuantCodec::kInt8;
    case compression::Codec::kInt4: return cuda::QuantCodec::kInt4;
    case compression::Codec::kFp4: return cuda::QuantCodec::kFp4;
    case compression::Codec::kInt2: return cuda::QuantCodec::kInt2;
    default:
      throw Error(fmt::format("device outer stage: the device quantizes int8, int4, fp4 and int2, not {}",
                              compression::codec_name(c)));
  }
}

size_t align4(size_t b) { return (b + 3) & ~size_t{3}; }

}  // namespace

CudaOuterStage::CudaOuterStage(std::function<std::span<float>()> shard, cudaStream_t stream,
                               std::function<void()> share)
    : shard_(std::move(shard)), stream_(stream), share_(std::move(share)) {}

CudaOuterStage::Fragment& CudaOuterStage::at(int index) {
  GEOLOCO_CHECK(index >= 0 && static_cast<size_t>(index) < frags_.size() && frags_[static_cast<size_t>(index)],
                "device outer stage: fragment {} is not defined ({} defined)", index, frags_.size());
  return *frags_[static_cast<size_t>(index)];
}

void CudaOuterStage::clear() {
  cuda::check_cuda(cudaStreamSynchronize(stream_), "device outer stage: synchronise before clearing");
  frags_.clear();
}

void CudaOuterStage::define(int index, const std::vector<outer::DeviceRun>& runs, std::span<const float> global,
                            std::span<const float> residual) {
  GEOLOCO_CHECK(index >= 0, "device outer stage: fragment {}", index);
  size_t n = 0;
  const size_t shard_n = shard_().size();
  for (const auto& r : runs) {
    GEOLOCO_CHECK(r.begin >= 0 && r.begin <= r.end && static_cast<size_t>(r.end) <= shard_n,
                  "device outer stage: fragment {}: run [{}, {}) outside the shard of {} elements", index, r.begin,
                  r.end, shard_n);
    n += static_cast<size_t>(r.end - r.begin);
  }
  GEOLOCO_CHECK(global.size() == n && (residual.empty() || residual.size() == n),
                "device outer stage: fragment {}: {} elements in its runs, {} global weights, {} residual values",
                index, n, global.size(), residual.size());
  if (frags_.size() <= static_cast<size_t>(index)) frags_.resize(static_cast<size_t>(index) + 1);
  auto& slot = frags_[static_cast<size_t>(index)];
  // A fragment of the same size keeps its buffers (a restore or a re-plan's second definition).
  if (!slot || slot->n != n || slot->residual.size() != residual.size()) {
    cuda::check_cuda(cudaStreamSynchronize(stream_), "device outer stage: synchronise before reallocating");
    slot = std::make_unique<Fragment>();
    slot->n = n;
    slot->global = cuda::DeviceBuffer<float>(std::max<size_t>(n, 1), "outer global weights (device)");
    if (!residual.empty())
      slot->residual = cuda::DeviceBuffer<float>(std::max<size_t>(n, 1), "error-feedback residual (device)");
  }
  slot->runs = runs;
  if (n > 0) {
    cuda::check_cuda(
        cudaMemcpyAsync(slot->global.data(), global.data(), n * sizeof(float), cudaMemcpyHostToDevice, stream_),
        "device outer stage: upload the global weights");
    if (!residual.empty())
      cuda::check_cuda(
          cudaMemcpyAsync(slot->residual.data(), residual.data(), n * sizeof(float), cudaMemcpyHostToDevice, stream_),
          "device outer stage: upload the residual");
  }
  cuda::check_cuda(cudaStreamSynchronize(stream_), "device outer stage: upload a fragment");
}

void CudaOuterStage::reserve_scratch(size_t n, size_t slices, size_t groups, bool ef) {
  // (quantize() synchronises before it returns: nothing uses the scratch when it is replaced)
  const size_t want = std::max<size_t>(n, 1);
  if (delta_.size() < want) {
    delta_ = cuda::DeviceBuffer<float>(want, "outer pseudo-gradient (device)");
    q_ = cuda::DeviceBuffer<uint8_t>(want, "outer one-byte codes (device)");
  }
  if (ef && corrected_.size() < want) corrected_ = cuda::DeviceBuffer<float>(want, "outer corrected values (device)");
  if (inv_.size() < std::max<size_t>(groups, 1)) inv_ = cuda::DeviceBuffer<float>(std::max<size_t>(groups, 1));
  const size_t parts = std::max<size_t>(slices, 1) * 3 * cuda::kErrorBlocks;
  if (partial_.size() < parts) {
    partial_ = cuda::DeviceBuffer<double>(parts, "outer error sums (device)");
    host_partial_ = cuda::PinnedBuffer<double>(parts, "outer error sums (host)");
  }
}

outer::StagedRound CudaOuterStage::quantize(int index, compression::Codec codec, uint32_t block, float decay,
                                            const std::vector<outer::DeviceSlice>& slices) {
  Fragment& f = at(index);
  GEOLOCO_CHECK(block > 0, "device outer stage: block 0");
  const auto c = quant_codec(codec);
  // The slices' layout in the packed buffer: each its scales (4-aligned), then its codes.
  struct Place {
    size_t scales = 0, codes = 0, scale_bytes = 0, code_bytes = 0;
  };
  std::vector<Place> place;
  size_t bytes = 0, most_groups = 0;
  for (const auto& s : slices) {
    GEOLOCO_CHECK(s.begin <= s.end && s.end <= f.n, "device outer stage: fragment {}: slice [{}, {}) of {}", index,
                  s.begin, s.end, f.n);
    const size_t len = s.end - s.begin, groups = cuda::quant_groups(len, block);
    Place p;
    p.scales = bytes;
    p.scale_bytes = groups * sizeof(float);
    p.codes = bytes + p.scale_bytes;
    p.code_bytes = cuda::quant_code_bytes(len, c);
    bytes = align4(p.codes + p.code_bytes);
    most_groups = std::max(most_groups, groups);
    place.push_back(p);
  }
  const bool ef = f.residual.size() > 0;
  reserve_scratch(f.n, slices.size(), most_groups, ef);
  if (f.packed.size() < std::max<size_t>(bytes, 1)) {
    f.packed = cuda::DeviceBuffer<uint8_t>(std::max<size_t>(bytes, 1), "outer scales and codes (device)");
    f.host = cuda::PinnedBuffer<uint8_t>(std::max<size_t>(bytes, 1), "outer scales and codes (host)");
  }
  // 1. The pseudo-gradient in gathered order: global - shard, run by run.
  const auto shard = shard_();
  size_t k = 0;
  for (const auto& r : f.runs) {
    const auto len = static_cast<size_t>(r.end - r.begin);
    cuda::launch_pseudo_gradient(f.global.data() + k, shard.data() + r.begin, delta_.data() + k, len, stream_);
    k += len;
  }
  // 2. Error feedback's correction, then each slice's scales and codes, the residual, the sums.
  float* x = delta_.data();
  if (ef && f.n > 0) {
    cuda::launch_ef_correct(delta_.data(), f.residual.data(), decay, corrected_.data(), f.n, stream_);
    x = corrected_.data();
  }
  for (size_t i = 0; i < slices.size(); ++i) {
    const size_t b = slices[i].begin, len = slices[i].end - b;
    auto* scales = reinterpret_cast<float*>(f.packed.data() + place[i].scales);
    cuda::launch_quantize(c, x + b, len, block, scales, f.packed.data() + place[i].codes, inv_.data(), q_.data() + b,
                          stream_);
    if (ef) cuda::launch_ef_residual(c, x + b, scales, q_.data() + b, len, block, f.residual.data() + b, stream_);
    cuda::launch_error_partials(c, delta_.data() + b, x + b, scales, q_.data() + b, len, block,
                                partial_.data() + i * 3 * cuda::kErrorBlocks, stream_);
  }
  // 3. Only the compressed bytes cross.
  const size_t parts = slices.size() * 3 * cuda::kErrorBlocks;
  if (bytes > 0)
    cuda::check_cuda(cudaMemcpyAsync(f.host.data(), f.packed.data(), bytes, cudaMemcpyDeviceToHost, stream_),
                     "device outer stage: download scales and codes");
  if (parts > 0)
    cuda::check_cuda(
        cudaMemcpyAsync(host_partial_.data(), partial_.data(), parts * sizeof(double), cudaMemcpyDeviceToHost, stream_),
        "device outer stage: download the error sums");
  cuda::check_cuda(cudaStreamSynchronize(stream_), fmt::format("device outer stage: quantize fragment {}", index));
  outer::StagedRound out;
  double refused = 0;
  for (size_t i = 0; i < slices.size(); ++i) {
    const auto sums = cuda::sum_error_partials(host_partial_.data() + i * 3 * cuda::kErrorBlocks);
    out.err2 += sums.err2;
    out.ref2 += sums.ref2;
    refused += sums.refused;
    outer::StagedSlice s;
    s.scales = std::span<const uint8_t>(f.host.data() + place[i].scales, place[i].scale_bytes);
    s.codes = std::span<const uint8_t>(f.host.data() + place[i].codes, place[i].code_bytes);
    s.elements = slices[i].end - slices[i].begin;
    out.slices.push_back(s);
  }
  if (refused > 0)
    throw Error(fmt::format(
        "fragment {}: {} value(s) of the corrected pseudo-gradient are non-finite or above 2^64 in magnitude "
        "(quantized on the device): the inner loop diverged",
        index, static_cast<uint64_t>(refused)));
  out.host_bytes = bytes + parts * sizeof(double);
  return out;
}

void CudaOuterStage::merge(int index, std::span<const float> global, float alpha) {
  Fragment& f = at(index);
  GEOLOCO_CHECK(global.size() == f.n, "device outer stage: fragment {}: {} global weights for {} elements", index,
                global.size(), f.n);
  if (f.n > 0)
    cuda::check_cuda(
        cudaMemcpyAsync(f.global.data(), global.data(), f.n * sizeof(float), cudaMemcpyHostToDevice, stream_),
        "device outer stage: upload the new global weights");
  const auto shard = shard_();
  size_t k = 0;
  for (const auto& r : f.runs) {
    const auto len = static_cast<size_t>(r.end - r.begin);
    cuda::launch_merge(shard.data() + r.begin, f.global.data() + k, alpha < 0 ? 0.0f : alpha, alpha < 0, len, stream_);
    k += len;
  }
  cuda::check_cuda(cudaStreamSynchronize(stream_), fmt::format("device outer stage: merge fragment {}", index));
  share_();
}

void CudaOuterStage::residual(int index, std::span<float> out) {
  Fragment& f = at(index);
  GEOLOCO_CHECK(out.size() == f.n && f.residual.size() > 0,
                "device outer stage: fragment {}: a residual of {} elements asked, it has {}", index, out.size(),
                f.residual.size() > 0 ? f.n : 0);
  if (f.n > 0)
    cuda::check_cuda(
        cudaMemcpyAsync(out.data(), f.residual.data(), f.n * sizeof(float), cudaMemcpyDeviceToHost, stream_),
        "device outer stage: download the residual");
  cuda::check_cuda(cudaStreamSynchronize(stream_), "device outer stage: download the residual");
}

uint64_t CudaOuterStage::device_bytes() const {
  uint64_t b = delta_.size() * 4 + corrected_.size() * 4 + inv_.size() * 4 + q_.size() + partial_.size() * 8;
  for (const auto& f : frags_)
    if (f) b += f->global.size() * 4 + f->residual.size() * 4 + f->packed.size();
  return b;
}

}  // namespace geoloco::trainer

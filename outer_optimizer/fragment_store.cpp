// The host and device fragment stores (fragment_store.hpp).
#include "outer_optimizer/fragment_store.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "core/trace.hpp"

namespace geoloco::outer {

void gather_local(const FragmentState& f, std::span<const float> shard, std::span<float> out) {
  size_t k = 0;
  for (const auto& r : f.local) {
    std::copy(shard.begin() + r.begin, shard.begin() + r.end, out.begin() + static_cast<std::ptrdiff_t>(k));
    k += static_cast<size_t>(r.size());
  }
}

void scatter_local(const FragmentState& f, std::span<const float> gathered, std::span<float> shard) {
  size_t k = 0;
  for (const auto& r : f.local) {
    std::copy_n(gathered.begin() + static_cast<std::ptrdiff_t>(k), r.size(), shard.begin() + r.begin);
    k += static_cast<size_t>(r.size());
  }
}

namespace {

// The site's shard in host memory: the snapshot gathers it, the merge writes it and the site
// all-gathers.
class HostStore : public FragmentStore {
 public:
  explicit HostStore(Site& site) : site_(site) {}
  bool on_device() const override { return false; }

  uint64_t snapshot(const FragmentState& f, Round& r, const compression::PipelineConfig&, const std::vector<Slice>&,
                    bool) override {
    r.delta.resize(f.n);
    gather_local(f, site_.shard_params(), r.delta);  // the pseudo-gradient is computed in place
    return f.n * sizeof(float);
  }

  void merge(const FragmentState& f, float alpha) override {
    auto shard = site_.shard_params();
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
    site_.shard_updated();
  }

 protected:
  Site& site_;
};

// A GPU site's device: each fragment's global weights and residual live there; a round is
// quantized there and only its scales and codes come to the host; the merge runs there. A
// round sent again after --resume is not quantized again: its snapshot is the host's.
class DeviceStore final : public HostStore {
 public:
  DeviceStore(Site& site, DeviceOuter& device) : HostStore(site), device_(device) {}
  bool on_device() const override { return true; }

  void define(const FragmentState& f) override {
    std::vector<DeviceRun> runs;
    for (const auto& r : f.local) runs.push_back({r.begin, r.end});
    device_.define(f.index, runs, f.global, f.ef ? std::span<const float>(f.ef->residual()) : std::span<const float>());
  }

  uint64_t snapshot(const FragmentState& f, Round& r, const compression::PipelineConfig& pcfg,
                    const std::vector<Slice>& frames, bool quantize) override {
    if (!quantize) return HostStore::snapshot(f, r, pcfg, frames, quantize);
    TraceSpan sp(site_.trace(), "device_quantize", TraceRecorder::kMainThread);
    std::vector<DeviceSlice> slices;
    for (const Slice& sl : frames) slices.push_back({sl.begin, sl.end});
    r.staged = device_.quantize(f.index, pcfg.codec, pcfg.block, static_cast<float>(pcfg.error_feedback_decay), slices);
    return r.staged->host_bytes;
  }

  void merge(const FragmentState& f, float alpha) override { device_.merge(f.index, f.global, alpha); }

  void residual_to_host(FragmentState& f) override {
    if (f.ef) device_.residual(f.index, f.ef->residual());
  }

 private:
  DeviceOuter& device_;
};

}  // namespace

std::unique_ptr<FragmentStore> make_fragment_store(Site& site, DeviceOuter* device,
                                                   const compression::PipelineConfig& pcfg) {
  if (device && device_quantizable(pcfg)) return std::make_unique<DeviceStore>(site, *device);
  return std::make_unique<HostStore>(site);
}

}  // namespace geoloco::outer

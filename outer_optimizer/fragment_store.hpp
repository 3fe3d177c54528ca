// FragmentStore: where a round's local values come from and where its merge goes -- the site's
// shard in host memory (HostStore), or a GPU site's device (DeviceStore: device_outer.hpp,
// outer.quantize_on), chosen whenever the fragments are built (a plan may change the codec to
// one the device does not quantize). The rest of the outer loop never asks which.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "compression/config.hpp"
#include "outer_optimizer/fragment.hpp"
#include "outer_optimizer/site.hpp"

namespace geoloco::outer {

class FragmentStore {
 public:
  virtual ~FragmentStore() = default;
  virtual bool on_device() const = 0;
  // Fragment f was built or restored: its runs, global weights and residual become the store's.
  virtual void define(const FragmentState& f) { (void)f; }
  // The round's snapshot of f's local values, after r's buffers were sized: gathered into
  // r.delta (the host path, or `quantize` false: a round sent again after --resume), or
  // quantized on the device into r.staged, frame by frame (`frames`, pcfg's codec and block).
  // Returns the bytes copied to the host.
  virtual uint64_t snapshot(const FragmentState& f, Round& r, const compression::PipelineConfig& pcfg,
                            const std::vector<Slice>& frames, bool quantize) = 0;
  // After f's outer step: the shard's part of f becomes f.global (alpha < 0) or
  // alpha * local + (1 - alpha) * global, then the site's replica is made consistent
  // (collective: every rank of the site at the same step).
  virtual void merge(const FragmentState& f, float alpha) = 0;
  // f's residual into its host copy f.ef (the device's; nothing on the host).
  virtual void residual_to_host(FragmentState& f) { (void)f; }
};

// The device store when `device` is given and quantizes `pcfg`'s codec (device_quantizable),
// else the host store.
std::unique_ptr<FragmentStore> make_fragment_store(Site& site, DeviceOuter* device,
                                                   const compression::PipelineConfig& pcfg);

}  // namespace geoloco::outer

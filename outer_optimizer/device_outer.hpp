// DeviceOuter: the outer loop's data path on a GPU site (outer.quantize_on: device | auto).
//
// Without it a CUDA site's round crosses PCIe in fp32 three times (the shard down for the
// pseudo-gradient, down again and up for the merge) and the host quantizes. With it each of
// the rank's fragments keeps, in device memory, its global weights and its error-feedback
// residual (in the fragment's gathered order: its runs of the shard, one after the other),
// and per round:
//   quantize()  pseudo-gradient = global - shard, corrected by the residual, quantized slice
//               by slice by trainer/cuda/quantize_kernel.hpp (the CPU codec's bits), the
//               residual updated; only the scales and packed codes come to the host, where
//               compression::Pipeline::encode_staged frames them (zstd, header, checksum):
//               the frames are the bytes the host path makes of the same values.
//   merge()     after the outer step: the new global weights go up once (fp32) and the shard
//               becomes them (blocking) or alpha * shard + (1 - alpha) * global (overlap),
//               then the site's ranks share it as shard_updated() does.
// The host keeps the authoritative global weights and outer optimizer state (the outer step
// and the average run there); the residual lives on the device and comes to the host only
// for a checkpoint, a re-plan or a join (residual()).
//
// Owned by the outer loop (a site hands it over through Site::device(), site.hpp) and
// implemented by the CUDA site strategy (trainer/loop/cuda_outer_stage.hpp); the outer loop's
// device fragment store (fragment_store.hpp) sees only this interface. Calls come from the inner
// loop's thread; quantize() returns when the host bytes are in place.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "compression/codec.hpp"

namespace geoloco::outer {

struct DeviceRun {
  int64_t begin = 0, end = 0;  // elements of this rank's shard
};

struct DeviceSlice {
  size_t begin = 0, end = 0;  // into the fragment's gathered vector; one frame each
};

// One slice's quantized payload in host (pinned) memory, valid until the fragment's next
// quantize() or define().
struct StagedSlice {
  std::span<const uint8_t> scales;  // little-endian fp32, one per block
  std::span<const uint8_t> codes;   // packed codes
  size_t elements = 0;
};

struct StagedRound {
  std::vector<StagedSlice> slices;  // in the order asked
  // The round's error figures over the slices (as exchange.hpp's add_own_error): sum of
  // squared (decoded - pseudo-gradient) and of squared pseudo-gradient.
  double err2 = 0, ref2 = 0;
  uint64_t host_bytes = 0;  // bytes copied to the host for it (scales, codes, the error sums)
};

class DeviceOuter {
 public:
  virtual ~DeviceOuter() = default;

  // Forgets every fragment (before the outer loop rebuilds them).
  virtual void clear() = 0;
  // Fragment `index`: its runs of the shard (in gathered order, `global.size()` elements in
  // all), its global weights, and its residual (`residual` empty: no error feedback; else
  // global.size() values, zeros for a fresh one). Uploads both.
  virtual void define(int index, const std::vector<DeviceRun>& runs, std::span<const float> global,
                      std::span<const float> residual) = 0;
  // The round's pseudo-gradient of fragment `index` from the shard's current values, each
  // slice quantized with `codec` (a scaled one: int8, int4, fp4, int2; else Error) in blocks
  // of `block` (error feedback when the fragment has a
  // residual: corrected = pseudo-gradient + residual, or + decay x residual for decay < 1).
  // Throws Error naming the fragment when a corrected value is non-finite or above 2^64 in
  // magnitude (what the CPU encoder refuses).
  virtual StagedRound quantize(int index, compression::Codec codec, uint32_t block, float decay,
                               const std::vector<DeviceSlice>& slices) = 0;
  // After the fragment's outer step: `global` (host, gathered) becomes the device copy, and the
  // shard's runs become it (alpha < 0) or alpha * shard + (1 - alpha) * global; then the
  // site's replica is made consistent (the collective part of shard_updated(): every rank of
  // the site calls it at the same step).
  virtual void merge(int index, std::span<const float> global, float alpha) = 0;
  // The fragment's residual, downloaded into `out` (global.size() elements).
  virtual void residual(int index, std::span<float> out) = 0;
  // Device bytes held for the fragments (global copies, residuals, round scratch).
  virtual uint64_t device_bytes() const = 0;
};

}  // namespace geoloco::outer

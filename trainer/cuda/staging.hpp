// Pseudo-gradient staging between the device and pinned host memory for the outer loop
// (compression and UCX run on the host: Debian's UCX has no CUDA transport).
//
// Copies run on a dedicated copy stream, ordered after the compute stream by an event, so
// the compute stream is never blocked: the copy of round r's pseudo-gradient overlaps the
// first inner steps of round r+1 as long as the caller does not overwrite the source range
// before wait() (stage from a snapshot buffer, not from live parameters that the next
// optimizer step changes).
#pragma once

#include <cuda_runtime_api.h>

#include <span>

#include "trainer/cuda/handles.hpp"

namespace geoloco::cuda {

class HostStager {
 public:
  // Pinned capacity of `capacity` floats; the copy stream is created on the current device.
  explicit HostStager(size_t capacity);

  // Device -> pinned host: the copy stream waits for everything enqueued on `after` so far,
  // then copies `device` (a device span, at most capacity floats). Returns at once.
  void download_async(std::span<const float> device, cudaStream_t after);
  // True when the last download/upload has finished (does not block).
  bool ready() const;
  // Blocks until the last transfer is done; returns the pinned host view of the downloaded
  // floats (valid until the next transfer).
  std::span<const float> wait();

  // Host -> device: copies `host` into pinned memory, enqueues the upload on the copy stream
  // and makes `before` wait for it (work enqueued on `before` afterwards sees the data).
  void upload_async(std::span<const float> host, std::span<float> device, cudaStream_t before);

  // The pinned buffer itself (for a caller that fills it directly, e.g. the decompressor).
  std::span<float> pinned() { return buf_.span(); }
  cudaStream_t copy_stream() const { return copy_.get(); }

 private:
  PinnedBuffer<float> buf_;
  Stream copy_;
  Event ordered_, done_;
  size_t last_ = 0;
  bool pending_ = false;
};

}  // namespace geoloco::cuda

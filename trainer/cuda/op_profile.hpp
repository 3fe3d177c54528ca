// OpProfile: device time per op kind on one stream, measured with timing events recorded
// between the ops (cudaEventElapsedTime), for benchmarks: bench_gpu_gpt2 profiles one step so
// a single GPU run says which ops to work on. Events do not synchronise, so a profiled step
// runs as an unprofiled one does, plus one event record per op.
//
//   OpProfile p(stream);
//   model.set_profile(&p);  // CudaGpt marks every op of forward/backward
//   p.mark("adamw");  opt.step(...);
//   OpTimes t = p.stop();   // synchronises the stream
#pragma once

#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include "trainer/cuda/handles.hpp"
#include "trainer/cuda/op_times.hpp"

namespace geoloco::cuda {

class OpProfile {
 public:
  explicit OpProfile(cudaStream_t stream) : stream_(stream) {}
  // The stream's work enqueued from now to the next mark (or stop) is `op`'s.
  void mark(const std::string& op);
  // Ends the last op, waits for the stream and returns the times; the profile is then empty
  // and can record another step (its events are reused).
  OpTimes stop();
  size_t marks() const { return labels_.size(); }

 private:
  cudaStream_t stream_;
  std::vector<Event> events_;  // timing events, one per mark plus the end; kept for reuse
  std::vector<std::string> labels_;
};

}  // namespace geoloco::cuda

// OverlappedAllReduce: all-reduces the gradient of each transformer block over the site's
// collective (NCCL, device spans) as soon as CudaGpt::backward reports the block final, while
// the backward pass of the blocks below still runs: the overlap ddp and zero1 allow (their
// gradients are fully all-reduced before the step). zero2/fsdp reduce-scatter by rank shards
// (shard_of over the whole buffer), which do not align with blocks: they reduce after
// backward as before.
//
// How: the hook records an event on the compute stream for the block and posts a task to an
// OrderedWorker; the worker thread waits for the event (so NCCL, which runs on its own
// stream, never reads a gradient before it is final) and calls all_reduce_sum on the block's
// range. Ranges in order: block L-1, ..., block 0, then [0, block 0 begin) (wte, wpe) and
// [block L-1 end, total) (ln_f). Every rank issues the same calls in the same order.
// Per element the sum is the same as one whole-buffer all_reduce only up to NCCL's choice of
// algorithm per message size; it is deterministic run to run and identical on all ranks.
#pragma once

#include <span>
#include <vector>

#include "trainer/cuda/cuda_gpt.hpp"
#include "trainer/cuda/handles.hpp"
#include "trainer/cuda/ordered_worker.hpp"
#include "trainer/model/param_layout.hpp"
#include "trainer/parallel/collective.hpp"

namespace geoloco::cuda {

class OverlappedAllReduce {
 public:
  // grads: the device gradient buffer passed to backward(). The current device is used by the
  // worker thread too.
  OverlappedAllReduce(parallel::Collective& coll, const trainer::ParamLayout& layout, std::span<float> grads);

  // Pass to CudaGpt::backward. Valid while this object lives.
  GradReadyHook hook();
  // Blocks until every reduction of this backward is done; rethrows a collective's error.
  void wait();

  // The [begin, end) ranges reduced for hook block b (b = -1: embeddings and ln_f).
  static std::vector<std::pair<int64_t, int64_t>> ranges_for(const trainer::ParamLayout& layout, int block);

 private:
  parallel::Collective& coll_;
  const trainer::ParamLayout& layout_;
  std::span<float> grads_;
  int device_;
  std::vector<Event> events_;  // one per block plus one for the rest: all may be pending at once
  OrderedWorker worker_;
};

}  // namespace geoloco::cuda

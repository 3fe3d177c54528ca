#include "trainer/cuda/grad_overlap.hpp"

namespace geoloco::cuda {

OverlappedAllReduce::OverlappedAllReduce(parallel::Collective& coll, const trainer::ParamLayout& layout,
                                         std::span<float> grads)
    : coll_(coll), layout_(layout), grads_(grads), device_(current_device_or_minus1()) {
  GEOLOCO_CHECK(static_cast<int64_t>(grads.size()) == layout.total(), "grads has {} floats, the layout {}",
                grads.size(), layout.total());
  GEOLOCO_CHECK(coll.memory() == parallel::MemorySpace::kCuda, "overlapped reduction needs a device collective, got {}",
                coll.backend());
  events_.reserve(size_t(layout.config().n_layer) + 1);
  for (int i = 0; i <= layout.config().n_layer; ++i) events_.emplace_back();
}

std::vector<std::pair<int64_t, int64_t>> OverlappedAllReduce::ranges_for(const trainer::ParamLayout& layout,
                                                                         int block) {
  const int L = layout.config().n_layer;
  if (block >= 0) return {{layout.block(block).begin, layout.block(block).end}};
  if (L == 0) return {{0, layout.total()}};
  return {{0, layout.block(0).begin}, {layout.block(L - 1).end, layout.total()}};
}

GradReadyHook OverlappedAllReduce::hook() {
  return [this](int block, cudaStream_t s) {
    Event& ev = events_.at(block >= 0 ? size_t(block) : size_t(layout_.config().n_layer));
    ev.record(s);
    worker_.post([this, block, &ev] {
      if (device_ >= 0) check_cuda(cudaSetDevice(device_), "overlap worker cudaSetDevice");
      ev.synchronize();
      for (const auto& [b, e] : ranges_for(layout_, block))
        if (e > b) coll_.all_reduce_sum(grads_.subspan(size_t(b), size_t(e - b)));
    });
  };
}

void OverlappedAllReduce::wait() { worker_.wait(); }

}  // namespace geoloco::cuda

#include "trainer/cuda/op_profile.hpp"

#include "trainer/cuda/cuda_check.hpp"

namespace geoloco::cuda {

void OpProfile::mark(const std::string& op) {
  if (events_.size() <= labels_.size()) events_.emplace_back(/*timing=*/true);
  events_[labels_.size()].record(stream_);
  labels_.push_back(op);
}

OpTimes OpProfile::stop() {
  if (labels_.empty()) return {};
  if (events_.size() <= labels_.size()) events_.emplace_back(/*timing=*/true);
  Event& end = events_[labels_.size()];
  end.record(stream_);
  end.synchronize();
  std::vector<double> times(labels_.size() + 1);
  for (size_t i = 1; i < times.size(); ++i) {
    float ms = 0;
    check_cuda(cudaEventElapsedTime(&ms, events_[0].get(), events_[i].get()), "cudaEventElapsedTime (op profile)");
    times[i] = ms;
  }
  std::vector<std::string> labels;
  labels.swap(labels_);
  return op_times_from_marks(labels, times);
}

}  // namespace geoloco::cuda

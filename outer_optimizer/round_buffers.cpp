// The pool of round buffers (round_buffers.hpp).
#include "outer_optimizer/round_buffers.hpp"

#include <algorithm>

namespace geoloco::outer {

void RoundBufferPool::begin(Round& r, size_t n, bool host_delta, const std::function<uint64_t()>& held) {
  if (r.delta.capacity() < n && !pool_.empty()) {
    Set& pooled = pool_.back();
    r.delta.swap(pooled.delta);
    r.decoded.swap(pooled.decoded);
    r.avg.swap(pooled.avg);
    pool_.pop_back();
  }
  r.delta.resize(host_delta ? n : 0);
  r.decoded.resize(n);
  r.avg.resize(n);
  peak_ = std::max(peak_, (held() + pooled()) * sizeof(float));
}

void RoundBufferPool::end(Round& r, bool several) {
  if (!several) return;
  Set done;
  done.delta.swap(r.delta);
  done.decoded.swap(r.decoded);
  done.avg.swap(r.avg);
  pool_.push_back(std::move(done));
}

void RoundBufferPool::prefault(size_t largest, bool host_delta) {
  if (!pool_.empty() || largest == 0) return;
  Set first;
  if (host_delta) first.delta.resize(largest);
  first.decoded.resize(largest);
  first.avg.resize(largest);
  pool_.push_back(std::move(first));
}

uint64_t RoundBufferPool::pooled() const {
  uint64_t n = 0;
  for (const auto& p : pool_) n += p.delta.capacity() + p.decoded.capacity() + p.avg.capacity();
  return n;
}

}  // namespace geoloco::outer

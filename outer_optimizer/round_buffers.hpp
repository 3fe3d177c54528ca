// RoundBufferPool: the buffers of a fragment's rounds (the snapshot turned pseudo-gradient, a
// decoded frame, the average: 12 bytes per element of a fragment in flight). With one fragment
// they stay with it from round to round; with several, only the fragments in flight hold theirs
// and a round done gives them back for the next that starts, so their pages stay mapped (no
// page faults per round) and at most as many sets exist as were ever in flight at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "outer_optimizer/fragment.hpp"

namespace geoloco::outer {

class RoundBufferPool {
 public:
  // Sizes r's buffers for a round of `n` elements, taken from the pool when r holds none large
  // enough; `host_delta` false leaves no host pseudo-gradient (quantized on the device).
  // `held` counts the elements every round buffer holds now (the pool's added here): the peak.
  void begin(Round& r, size_t n, bool host_delta, const std::function<uint64_t()>& held);
  // The round is done: with `several` fragments its buffers go back to the pool.
  void end(Round& r, bool several);
  // Fragments were just built: allocates and touches what their rounds will use (one set for
  // several fragments, sized for the largest), off the sync's path.
  void prefault(size_t largest, bool host_delta);
  void clear() { pool_.clear(); }
  // Elements the pool holds.
  uint64_t pooled() const;
  // The most bytes the rounds' buffers held at once.
  uint64_t peak_bytes() const { return peak_; }

 private:
  struct Set {
    std::vector<float> delta, decoded, avg;
  };
  std::vector<Set> pool_;
  uint64_t peak_ = 0;
};

}  // namespace geoloco::outer

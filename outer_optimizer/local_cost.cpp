// The outer loop's host-side cost per sync (local_cost.hpp).
#include "outer_optimizer/local_cost.hpp"

#include <algorithm>
#include <chrono>

#include "compression/pipeline.hpp"
#include "compression/synthetic.hpp"
#include "outer_optimizer/auto_plan.hpp"

namespace geoloco::outer {

std::map<int, double> measure_local_sync_s(const compression::PipelineConfig& base, const std::vector<int>& bits,
                                           int sites, size_t elements, size_t sample) {
  using Clock = std::chrono::steady_clock;
  std::map<int, double> out;
  if (elements == 0) {
    for (int b : bits) out[b] = 0;
    return out;
  }
  const size_t n = std::max<size_t>(std::min(elements, sample), 65536);
  const auto local = compression::synthetic_pseudo_gradient(n, 7);
  std::vector<float> global(n, 0.0f), delta(n), decoded(n), avg(n), momentum(n, 0.0f), residual(n, 0.0f);
  std::vector<uint8_t> frame;
  for (int b : bits) {
    PlanDecision d;
    d.bits = b;
    d.codec = codec_for_bits(b);
    const compression::PipelineConfig cfg = plan_compression(base, d);
    compression::Pipeline p(cfg);
    double best = 1e300;
    for (int rep = 0; rep < 2; ++rep) {
      const auto t0 = Clock::now();
      for (size_t i = 0; i < n; ++i) delta[i] = global[i] - local[i];  // the pseudo-gradient
      if (cfg.error_feedback)
        p.encode_with_residual(delta, residual, frame);
      else
        p.encode(delta, nullptr, frame);
      std::fill(avg.begin(), avg.end(), 0.0f);
      const float w = 1.0f / static_cast<float>(std::max(sites, 1));
      for (int s = 0; s < std::max(sites, 1); ++s) {  // every site's frame (here: this one's)
        p.decode(frame, n, decoded);
        for (size_t i = 0; i < n; ++i) avg[i] += w * decoded[i];
      }
      for (size_t i = 0; i < n; ++i) {  // Nesterov and the copy back
        momentum[i] = 0.9f * momentum[i] + avg[i];
        global[i] -= 0.7f * (avg[i] + 0.9f * momentum[i]);
        delta[i] = global[i];
      }
      best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
    }
    out[b] = best * static_cast<double>(elements) / static_cast<double>(n);
  }
  return out;
}

}  // namespace geoloco::outer

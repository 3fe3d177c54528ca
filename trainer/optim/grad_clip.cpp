#include "trainer/optim/grad_clip.hpp"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace geoloco::trainer {

double sum_of_squares(std::span<const float> g) {
  // Fixed-size blocks summed in index order: independent of the OpenMP thread count.
  constexpr int64_t kBlock = 1 << 14;
  const int64_t n = static_cast<int64_t>(g.size());
  const int64_t nb = (n + kBlock - 1) / kBlock;
  std::vector<double> partial(static_cast<size_t>(nb), 0.0);
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < nb; ++b) {
    double s = 0.0;
    const int64_t e = std::min(n, (b + 1) * kBlock);
    for (int64_t i = b * kBlock; i < e; ++i) s += static_cast<double>(g[i]) * g[i];
    partial[static_cast<size_t>(b)] = s;
  }
  double total = 0.0;
  for (double s : partial) total += s;
  return total;
}

float clip_to_norm(std::span<float> g, double global_norm, double max_norm) {
  if (max_norm <= 0.0 || global_norm <= max_norm) return 1.0f;
  const float scale = static_cast<float>(max_norm / (global_norm + 1e-6));
  const int64_t n = static_cast<int64_t>(g.size());
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) g[i] *= scale;
  return scale;
}

}  // namespace geoloco::trainer

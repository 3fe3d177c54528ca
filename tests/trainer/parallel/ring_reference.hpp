// The exact answer our ring all-reduce must produce: element i of chunk c (owner c) is
// summed as ((x_{c+1} + x_{c+2}) + ...) + x_c over ranks mod P (gloo_collective.hpp).
#pragma once

#include <cstdint>
#include <vector>

#include "core/rng.hpp"
#include "core/shard.hpp"

namespace geoloco::parallel::testing {

// Per-rank test data with a wide spread of magnitudes, so summation order changes bits.
inline std::vector<float> rank_data(int rank, int64_t n, uint64_t seed = 7) {
  Rng rng(mix_seed(seed, static_cast<uint64_t>(rank)));
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<float>(rng.normal() * (1 << rng.below(20)));
  return v;
}

inline std::vector<float> ring_sum(const std::vector<std::vector<float>>& per_rank) {
  const int P = static_cast<int>(per_rank.size());
  const int64_t n = static_cast<int64_t>(per_rank[0].size());
  std::vector<float> out(static_cast<size_t>(n));
  for (int c = 0; c < P; ++c) {
    ShardRange s = shard_of(n, c, P);
    for (int64_t i = s.offset; i < s.end(); ++i) {
      float acc = per_rank[static_cast<size_t>((c + 1) % P)][static_cast<size_t>(i)];
      for (int k = 2; k <= P; ++k) acc = acc + per_rank[static_cast<size_t>((c + k) % P)][static_cast<size_t>(i)];
      out[static_cast<size_t>(i)] = acc;
    }
  }
  return out;
}

}  // namespace geoloco::parallel::testing

#include "trainer/cuda/token_buckets.hpp"

#include <fmt/format.h>

#include <limits>

#include "core/error.hpp"

namespace geoloco::cuda {

void TokenBuckets::build(std::span<const int32_t> ids, int vocab) {
  const auto N = static_cast<int64_t>(ids.size());
  if (vocab < 1) throw ConfigError(fmt::format("token buckets: vocabulary size {} must be positive", vocab));
  if (N >= std::numeric_limits<int32_t>::max() / 2)
    throw InputError(fmt::format("token buckets: {} rows do not fit int32 indices", N));
  count_.assign(static_cast<size_t>(vocab), 0);
  for (int64_t n = 0; n < N; ++n) {
    const int32_t t = ids[static_cast<size_t>(n)];
    if (t < 0 || t >= vocab) [[unlikely]]
      throw InputError(fmt::format("token buckets: id {} at position {} is outside [0, {})", t, n, vocab));
    ++count_[static_cast<size_t>(t)];
  }
  int64_t groups = 0;
  for (const int32_t c : count_) groups += c > 0;
  n_rows_ = N;
  n_groups_ = groups;
  packed_.resize(static_cast<size_t>(2 * N + 1 + groups));
  int32_t* rows = packed_.data();
  int32_t* starts = rows + N;
  int32_t* tokens = starts + N + 1;
  // count_ becomes each token's next write position in rows (exclusive prefix sums).
  int32_t at = 0;
  int64_t g = 0;
  for (int32_t t = 0; t < vocab; ++t) {
    const int32_t c = count_[static_cast<size_t>(t)];
    if (c == 0) continue;
    starts[g] = at;
    tokens[g] = t;
    ++g;
    count_[static_cast<size_t>(t)] = at;
    at += c;
  }
  starts[g] = at;  // starts[groups + 1 .. N] are never read (left from earlier batches)
  for (int64_t n = 0; n < N; ++n)
    rows[count_[static_cast<size_t>(ids[static_cast<size_t>(n)])]++] = static_cast<int32_t>(n);
}

}  // namespace geoloco::cuda

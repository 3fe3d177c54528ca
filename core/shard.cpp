#include "core/shard.hpp"

#include <algorithm>

#include "core/error.hpp"

namespace geoloco {

ShardRange shard_of(int64_t n, int rank, int size) {
  GEOLOCO_CHECK(n >= 0, "shard_of: n {} is negative", n);
  GEOLOCO_CHECK(size >= 1, "shard_of: size {} must be >= 1", size);
  GEOLOCO_CHECK(rank >= 0 && rank < size, "shard_of: rank {} outside [0, {})", rank, size);
  const int64_t q = n / size;
  const int64_t m = n % size;
  ShardRange s;
  s.count = q + (rank < m ? 1 : 0);
  s.offset = rank * q + std::min<int64_t>(rank, m);
  return s;
}

}  // namespace geoloco

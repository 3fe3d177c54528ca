#include "core/shard.hpp"

#include <algorithm>

#include "core/error.hpp"

namespace geoloco {

ShardRange shard_of(int64_t n, int rank, int size) {
  GEOLOCO_CHECK_GE(n, int64_t{0}, "shard_of: elements");
  GEOLOCO_CHECK_GE(size, 1, "shard_of: ranks");
  GEOLOCO_CHECK(rank >= 0 && rank < size, "shard_of: rank {} outside [0, {})", rank, size);
  const int64_t q = n / size;
  const int64_t m = n % size;
  ShardRange s;
  s.count = q + (rank < m ? 1 : 0);
  s.offset = rank * q + std::min<int64_t>(rank, m);
  return s;
}

}  // namespace geoloco

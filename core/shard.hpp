// Sharding of a flat buffer of n elements over `size` ranks, shared by every collective
// (reduce_scatter, all_gather) and by the ZeRO/FSDP strategies built on top.
//
// Definition (contiguous, balanced, no padding): with q = n / size and m = n % size, rank r
// owns [offset, offset + count) where
//     count  = q + (r < m ? 1 : 0)
//     offset = r * q + min(r, m)
// so the first n % size ranks hold one extra element, shards tile [0, n) in rank order,
// and a rank may own zero elements when n < size.
#pragma once

#include <cstdint>

namespace geoloco {

struct ShardRange {
  int64_t offset = 0;
  int64_t count = 0;
  int64_t end() const { return offset + count; }
  bool operator==(const ShardRange&) const = default;
};

// Throws geoloco::Error when n < 0, size < 1 or rank is outside [0, size).
ShardRange shard_of(int64_t n, int rank, int size);

}  // namespace geoloco

#include "trainer/parallel/hybrid_shard.hpp"

#include <fmt/format.h>

#include "core/error.hpp"

namespace geoloco::parallel {

HybridShards hybrid_shards(int64_t n, int rank, int ranks, int group_size) {
  if (group_size < 1 || ranks % group_size != 0)
    throw InputError(
        fmt::format("hybrid sharding: group size {} does not divide the site's {} ranks", group_size, ranks));
  GEOLOCO_CHECK(rank >= 0 && rank < ranks, "hybrid_shards: rank {} outside [0, {})", rank, ranks);
  HybridShards h;
  h.ranks = ranks;
  h.group_size = group_size;
  h.groups = ranks / group_size;
  h.group = rank / group_size;
  h.local = rank % group_size;
  for (int g = 0; g < h.groups; ++g) {
    const ShardRange first = shard_of(n, g * group_size, ranks);
    const ShardRange last = shard_of(n, g * group_size + group_size - 1, ranks);
    const ShardRange block{first.offset, last.end() - first.offset};
    const ShardRange piece = shard_of(n, g * group_size + h.local, ranks);
    const ShardRange in_block = shard_of(block.count, h.local, group_size);
    GEOLOCO_CHECK(in_block.offset + block.offset == piece.offset && in_block.count == piece.count,
                  "hybrid_shards: block {} of n={} over {} ranks does not split into shard_of chunks", g, n, ranks);
    h.blocks.push_back(block);
    h.pieces.push_back(piece);
    h.held_offset.push_back(h.held);
    h.held += piece.count;
  }
  for (int g = 0; g < h.groups; ++g) {
    const ShardRange r = shard_of(h.held, g, h.groups);
    GEOLOCO_CHECK(
        r.offset == h.held_offset[static_cast<size_t>(g)] && r.count == h.pieces[static_cast<size_t>(g)].count,
        "hybrid_shards: the held pieces of n={} over {} ranks do not split over the replica set", n, ranks);
  }
  h.own = h.pieces[static_cast<size_t>(h.group)];
  return h;
}

}  // namespace geoloco::parallel

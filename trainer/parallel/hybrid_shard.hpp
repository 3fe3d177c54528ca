// Hybrid sharding's layout: a site of N ranks as N/G groups of G consecutive ranks (group
// g = ranks gG .. gG+G-1, an NVLink island when rank r runs on GPU r); parameters sharded inside
// a group, replicated across groups.
//
// The layout keeps every rank's site shard exactly shard_of(n, r, N) -- the range the outer
// loop exchanges and checkpoints, whatever the strategy -- by cutting the flat buffer into
// N/G blocks: block g = the union of the shard_of(n, ., N) chunks of group g's ranks. Inside a
// group, rank (g', l) holds chunk gG + l of every block g: one "piece" per block, n/G
// elements in all, and its own chunk is the piece of its own block. Because shard_of puts its
// extra elements first, two plain shard_of partitions give exactly these pieces:
//   * block g over the group's G ranks: shard_of(|block g|, l, G) == chunk gG + l;
//   * a rank's held pieces (concatenated, block order) over its replica set (the N/G ranks
//     of local index l, one per group, ranked by group): shard_of(held, g, N/G) == piece g.
// So a group's reduce-scatter/all-gather of one block, and a replica set's reduce-scatter/
// all-gather of the held pieces, are ordinary collectives on subgroups (Collective::split).
// hybrid_shards() checks both identities and throws if either fails.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/shard.hpp"

namespace geoloco::parallel {

struct HybridShards {
  int ranks = 1, group_size = 1, groups = 1;
  int group = 0, local = 0;          // this rank = group * group_size + local
  std::vector<ShardRange> blocks;    // by group: absolute range of block g
  std::vector<ShardRange> pieces;    // by group: this rank's absolute piece of block g
  std::vector<int64_t> held_offset;  // by group: where piece g sits in the held buffer
  int64_t held = 0;                  // elements held (the sum of the pieces)
  ShardRange own;                    // pieces[group] == shard_of(n, rank, ranks)
  int64_t own_held_offset() const { return held_offset.at(static_cast<size_t>(group)); }
};

// Throws InputError when group_size does not divide ranks or is < 1, Error on a broken identity.
HybridShards hybrid_shards(int64_t n, int rank, int ranks, int group_size);

}  // namespace geoloco::parallel

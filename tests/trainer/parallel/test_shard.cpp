#include <gtest/gtest.h>

#include "core/error.hpp"
#include "trainer/parallel/hybrid_shard.hpp"
#include "core/shard.hpp"

namespace geoloco::parallel {
namespace {

TEST(Shard, UnevenTable) {
  // n = 10 over 4 ranks: q = 2, m = 2 -> counts 3, 3, 2, 2.
  EXPECT_EQ(shard_of(10, 0, 4), (ShardRange{0, 3}));
  EXPECT_EQ(shard_of(10, 1, 4), (ShardRange{3, 3}));
  EXPECT_EQ(shard_of(10, 2, 4), (ShardRange{6, 2}));
  EXPECT_EQ(shard_of(10, 3, 4), (ShardRange{8, 2}));
}

TEST(Shard, FewerElementsThanRanks) {
  EXPECT_EQ(shard_of(2, 0, 4), (ShardRange{0, 1}));
  EXPECT_EQ(shard_of(2, 1, 4), (ShardRange{1, 1}));
  EXPECT_EQ(shard_of(2, 2, 4), (ShardRange{2, 0}));
  EXPECT_EQ(shard_of(2, 3, 4), (ShardRange{2, 0}));
  EXPECT_EQ(shard_of(0, 2, 3), (ShardRange{0, 0}));
}

TEST(Shard, TilesEveryLengthExactly) {
  for (int size = 1; size <= 9; ++size) {
    for (int64_t n = 0; n <= 50; ++n) {
      int64_t next = 0;
      for (int r = 0; r < size; ++r) {
        ShardRange s = shard_of(n, r, size);
        ASSERT_EQ(s.offset, next) << "n=" << n << " size=" << size << " rank=" << r;
        ASSERT_TRUE(s.count == n / size || s.count == n / size + 1);
        ASSERT_EQ(s.count, n / size + (r < n % size ? 1 : 0));
        next = s.end();
      }
      ASSERT_EQ(next, n);
    }
  }
}

TEST(Shard, RejectsBadArguments) {
  EXPECT_THROW(shard_of(-1, 0, 2), Error);
  EXPECT_THROW(shard_of(10, 2, 2), Error);
  EXPECT_THROW(shard_of(10, -1, 2), Error);
  EXPECT_THROW(shard_of(10, 0, 0), Error);
}

// Hybrid's layout for every small shape: the own piece is the site shard shard_of(n, r, N), a
// rank's pieces are chunk gG + l of each block, the blocks tile [0, n), and every rank of a
// group together holds each block exactly once (hybrid_shards checks the two shard_of
// identities itself and would throw).
TEST(HybridShard, PiecesAreTheSiteChunksForEveryShape) {
  for (int64_t n : {0, 1, 5, 7, 12, 13, 97, 1000, 1001}) {
    for (int ranks = 1; ranks <= 8; ++ranks) {
      for (int g = 1; g <= ranks; ++g) {
        if (ranks % g != 0) continue;
        std::vector<int> covered(static_cast<size_t>(n), 0);
        for (int r = 0; r < ranks; ++r) {
          const HybridShards h = hybrid_shards(n, r, ranks, g);
          SCOPED_TRACE(::testing::Message() << "n " << n << " rank " << r << "/" << ranks << " group size " << g);
          EXPECT_EQ(h.own, shard_of(n, r, ranks));
          EXPECT_EQ(h.groups, ranks / g);
          int64_t next = 0, held = 0;
          for (int b = 0; b < h.groups; ++b) {
            EXPECT_EQ(h.blocks[size_t(b)].offset, next);
            next = h.blocks[size_t(b)].end();
            EXPECT_EQ(h.pieces[size_t(b)], shard_of(n, b * g + r % g, ranks));
            EXPECT_EQ(h.held_offset[size_t(b)], held);
            held += h.pieces[size_t(b)].count;
            if (r / g == 0)  // one group's ranks cover each block once
              for (int64_t i = h.pieces[size_t(b)].offset; i < h.pieces[size_t(b)].end(); ++i) ++covered[size_t(i)];
          }
          EXPECT_EQ(next, n);
          EXPECT_EQ(h.held, held);
        }
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(covered[size_t(i)], 1) << "element " << i;
      }
    }
  }
}

TEST(HybridShard, GroupSizeMustDivideTheRanks) {
  EXPECT_THROW(hybrid_shards(100, 0, 6, 4), InputError);
  EXPECT_THROW(hybrid_shards(100, 0, 6, 0), InputError);
  EXPECT_THROW(hybrid_shards(100, 6, 6, 2), Error);
}

}  // namespace
}  // namespace geoloco::parallel

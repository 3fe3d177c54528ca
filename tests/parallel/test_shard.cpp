#include <gtest/gtest.h>

#include "trainer/core/error.hpp"
#include "trainer/parallel/shard.hpp"

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

}  // namespace
}  // namespace geoloco::parallel

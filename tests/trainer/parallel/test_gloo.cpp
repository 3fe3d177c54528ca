// Gloo backend with ranks as threads in one process.
#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "tests/trainer/parallel/ring_reference.hpp"
#include "tests/trainer/parallel/test_util.hpp"
#include "trainer/parallel/errors.hpp"
#include "trainer/parallel/gloo_collective.hpp"

namespace geoloco::parallel {
namespace {

using namespace std::chrono_literals;
using testing::options;

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

class GlooRanks : public ::testing::TestWithParam<int> {};

TEST_P(GlooRanks, AllReduceRankFillIsExactForOddLengths) {
  const int P = GetParam();
  const int port = test::fresh_port();
  std::vector<int64_t> lengths = {0, 1, P - 1, P + 1, 1000, 12345};
  if (P == 4) lengths.push_back((int64_t{1} << 20) + 3);  // large: many MiB through the ring
  test::run_ranks(P, [&](int r) {
    auto c = make_gloo(options("paris", r, P, port));
    EXPECT_EQ(c->rank(), r);
    EXPECT_EQ(c->size(), P);
    EXPECT_STREQ(c->backend(), "gloo");
    for (int64_t n : lengths) {
      std::vector<float> v(static_cast<size_t>(n), static_cast<float>(r));
      c->all_reduce_sum(v);
      const float want = static_cast<float>(P * (P - 1) / 2);
      int64_t wrong = 0;
      for (float x : v) wrong += (x != want);
      EXPECT_EQ(wrong, 0) << "rank " << r << " n " << n;
    }
  });
}

TEST_P(GlooRanks, AllReduceIsBitIdenticalAndFollowsRingOrder) {
  const int P = GetParam();
  const int port = test::fresh_port();
  const int64_t n = 4099;
  std::vector<std::vector<float>> inputs, outputs(static_cast<size_t>(P));
  for (int r = 0; r < P; ++r) inputs.push_back(testing::rank_data(r, n));
  const std::vector<float> want = testing::ring_sum(inputs);
  test::run_ranks(P, [&](int r) {
    auto c = make_gloo(options("paris", r, P, port));
    std::vector<float> v = inputs[static_cast<size_t>(r)];
    c->all_reduce_sum(v);
    outputs[static_cast<size_t>(r)] = v;
  });
  for (int r = 0; r < P; ++r) {
    EXPECT_TRUE(same_bits(outputs[static_cast<size_t>(r)], want)) << "rank " << r;
    EXPECT_TRUE(same_bits(outputs[static_cast<size_t>(r)], outputs[0])) << "rank " << r;
  }
}

TEST_P(GlooRanks, ReduceScatterThenAllGatherEqualsAllReduce) {
  const int P = GetParam();
  for (int64_t n : {int64_t{1}, int64_t{P + 1}, int64_t{777}}) {
    const int port = test::fresh_port();
    std::vector<std::vector<float>> inputs;
    for (int r = 0; r < P; ++r) inputs.push_back(testing::rank_data(r, n, 99));
    const std::vector<float> want = testing::ring_sum(inputs);
    test::run_ranks(P, [&](int r) {
      auto c = make_gloo(options("paris", r, P, port));
      const ShardRange s = shard_of(n, r, P);
      std::vector<float> shard(static_cast<size_t>(s.count));
      c->reduce_scatter_sum(inputs[static_cast<size_t>(r)], shard);
      std::vector<float> want_shard(want.begin() + s.offset, want.begin() + s.end());
      EXPECT_TRUE(same_bits(shard, want_shard)) << "rank " << r << " n " << n;
      // Gather from a separate shard buffer...
      std::vector<float> full(static_cast<size_t>(n), -1.0f);
      c->all_gather(shard, full);
      EXPECT_TRUE(same_bits(full, want)) << "rank " << r << " n " << n;
      // ...and in place (the shard already sits at its offset).
      std::vector<float> inplace(static_cast<size_t>(n), -2.0f);
      std::copy(shard.begin(), shard.end(), inplace.begin() + s.offset);
      c->all_gather(std::span<const float>(inplace.data() + s.offset, shard.size()), inplace);
      EXPECT_TRUE(same_bits(inplace, want)) << "rank " << r << " n " << n;
      // The input is untouched.
      EXPECT_TRUE(same_bits(inputs[static_cast<size_t>(r)], testing::rank_data(r, n, 99)));
    });
  }
}

TEST_P(GlooRanks, BroadcastFromEveryRoot) {
  const int P = GetParam();
  const int port = test::fresh_port();
  test::run_ranks(P, [&](int r) {
    auto c = make_gloo(options("paris", r, P, port));
    for (int root = 0; root < P; ++root) {
      std::vector<float> v(1001);
      for (size_t i = 0; i < v.size(); ++i) v[i] = r == root ? static_cast<float>(i * 3 + root) : -1.0f;
      c->broadcast(v, root);
      for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(v[i], static_cast<float>(i * 3 + root)) << r << " " << root;
    }
    std::vector<float> empty;
    c->broadcast(empty, 0);
    EXPECT_THROW(c->broadcast(empty, P), CollectiveError);
  });
}

TEST_P(GlooRanks, DoubleAndUint64AllReduce) {
  const int P = GetParam();
  const int port = test::fresh_port();
  test::run_ranks(P, [&](int r) {
    auto c = make_gloo(options("paris", r, P, port));
    std::vector<uint64_t> u(37);
    for (size_t i = 0; i < u.size(); ++i) u[i] = (uint64_t{1} << 63) + i * 1000 + static_cast<uint64_t>(r);
    c->all_reduce_sum(u);
    for (size_t i = 0; i < u.size(); ++i) {
      // Sum modulo 2^64: P copies of 2^63 plus P*(1000 i) plus 0+1+...+(P-1).
      uint64_t want = static_cast<uint64_t>(P) * (uint64_t{1} << 63) + static_cast<uint64_t>(P) * i * 1000 +
                      static_cast<uint64_t>(P * (P - 1) / 2);
      ASSERT_EQ(u[i], want);
    }
    std::vector<double> d(5, 0.5 * r);
    c->all_reduce_sum(d);
    for (double x : d) ASSERT_EQ(x, 0.25 * P * (P - 1));
  });
}

TEST_P(GlooRanks, AllGatherBytesOfDifferentLengths) {
  const int P = GetParam();
  const int port = test::fresh_port();
  test::run_ranks(P, [&](int r) {
    auto c = make_gloo(options("paris", r, P, port));
    std::vector<std::byte> mine(static_cast<size_t>(r * 3), static_cast<std::byte>(r + 1));
    auto all = c->all_gather_bytes(mine);
    ASSERT_EQ(all.size(), static_cast<size_t>(P));
    for (int i = 0; i < P; ++i) {
      ASSERT_EQ(all[static_cast<size_t>(i)].size(), static_cast<size_t>(i * 3));
      for (auto b : all[static_cast<size_t>(i)]) ASSERT_EQ(b, static_cast<std::byte>(i + 1));
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Sizes, GlooRanks, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return "P" + std::to_string(info.param); });

TEST(Gloo, TinySegmentsGiveTheSameBits) {
  // 24-byte segments: every chunk crosses many segments, so the per-segment reduction and
  // slot numbering are exercised with small inputs.
  const int P = 3;
  const int64_t n = 1001;
  const int port = test::fresh_port();
  std::vector<std::vector<float>> inputs;
  for (int r = 0; r < P; ++r) inputs.push_back(testing::rank_data(r, n, 3));
  const std::vector<float> want = testing::ring_sum(inputs);
  test::run_ranks(P, [&](int r) {
    auto o = options("paris", r, P, port);
    o.segment_bytes = 24;
    auto c = make_gloo(o);
    std::vector<float> v = inputs[static_cast<size_t>(r)];
    c->all_reduce_sum(v);
    EXPECT_TRUE(same_bits(v, want)) << "rank " << r;
    std::vector<float> b = r == 2 ? inputs[2] : std::vector<float>(static_cast<size_t>(n), 0.0f);
    c->broadcast(b, 2);
    EXPECT_TRUE(same_bits(b, inputs[2])) << "rank " << r;
    std::vector<double> d(77, 0.25 * (r + 1));
    c->all_reduce_sum(d);
    for (double x : d) ASSERT_EQ(x, 0.25 * P * (P + 1) / 2);
    std::vector<std::byte> blob(static_cast<size_t>(50 + r), static_cast<std::byte>(r));
    auto all = c->all_gather_bytes(blob);
    for (int i = 0; i < P; ++i)
      ASSERT_EQ(all[static_cast<size_t>(i)],
                std::vector<std::byte>(static_cast<size_t>(50 + i), static_cast<std::byte>(i)));
  });
  auto bad = options("paris", 0, 1, port);
  bad.segment_bytes = 12;
  EXPECT_THROW(make_gloo(bad), InputError);
}

TEST(Gloo, BytesMovedAreExact) {
  const int P = 3;
  const int64_t n = 10;  // shards 4, 3, 3
  const int port = test::fresh_port();
  test::run_ranks(P, [&](int r) {
    auto c = make_gloo(options("paris", r, P, port));
    const int64_t cr = shard_of(n, r, P).count, cnext = shard_of(n, (r + 1) % P, P).count;
    std::vector<float> v(static_cast<size_t>(n), 1.0f);
    c->all_reduce_sum(v);
    c->all_reduce_sum(v);
    std::vector<float> shard(static_cast<size_t>(cr));
    c->reduce_scatter_sum(v, shard);
    c->all_gather(shard, v);
    c->broadcast(v, 1);
    c->barrier();
    const auto& s = c->stats();
    EXPECT_EQ(s[CollectiveKind::kAllReduce].calls, 2u);
    EXPECT_EQ(s[CollectiveKind::kAllReduce].bytes_sent, 2u * static_cast<uint64_t>(2 * n - cr - cnext) * 4);
    EXPECT_EQ(s[CollectiveKind::kAllReduce].payload_bytes, 2u * n * 4);
    EXPECT_EQ(s[CollectiveKind::kReduceScatter].bytes_sent, static_cast<uint64_t>(n - cr) * 4);
    EXPECT_EQ(s[CollectiveKind::kAllGather].bytes_sent, static_cast<uint64_t>(n - cnext) * 4);
    EXPECT_EQ(s[CollectiveKind::kBroadcast].bytes_sent, r == 1 ? static_cast<uint64_t>((P - 1) * n * 4) : 0u);
    EXPECT_EQ(s[CollectiveKind::kBarrier].bytes_sent, 2u);  // ceil(log2 3) rounds of 1 byte
    EXPECT_EQ(s.total_bytes_sent(),
              s[CollectiveKind::kAllReduce].bytes_sent + s[CollectiveKind::kReduceScatter].bytes_sent +
                  s[CollectiveKind::kAllGather].bytes_sent + s[CollectiveKind::kBroadcast].bytes_sent + 2u);
    auto j = s.to_json();
    EXPECT_EQ(j["all_reduce"]["calls"].get<uint64_t>(), 2u);
    EXPECT_EQ(j["total_bytes_sent"].get<uint64_t>(), s.total_bytes_sent());
    // v = 3 after the first all-reduce, 9 after the second, 27 after reduce-scatter +
    // all-gather: every path kept the exact sum.
    for (float x : v) ASSERT_EQ(x, 27.0f);
  });
}

TEST(Gloo, WrongShardSizeIsRejectedWithContext) {
  const int port = test::fresh_port();
  test::run_ranks(2, [&](int r) {
    auto c = make_gloo(options("lyon", r, 2, port));
    std::vector<float> in(9, 1.0f), out(3);  // shards are 5 and 4
    try {
      c->reduce_scatter_sum(in, out);
      ADD_FAILURE() << "accepted a wrong shard size";
    } catch (const CollectiveError& e) {
      EXPECT_NE(std::string(e.what()).find(fmt::format("site lyon rank {}/2", r)), std::string::npos) << e.what();
    }
    std::vector<float> full(9);
    EXPECT_THROW(c->all_gather(out, full), CollectiveError);
    // The group still works: the size check fails before any communication.
    std::vector<float> v(9, 1.0f);
    c->all_reduce_sum(v);
    EXPECT_EQ(v[8], 2.0f);
  });
}

// split(): 6 ranks as 3 groups of 2 consecutive ranks and 2 strided sets of 3 (hybrid's group
// and replica set). Each subgroup reduces only its members' values, ranked by key, and names
// itself in errors; the parent group keeps working beside them.
TEST(Gloo, SplitIntoGroupsAndStridedSets) {
  const int port = test::fresh_port();
  test::run_ranks(6, [&](int r) {
    auto c = make_gloo(options("oslo", r, 6, port));
    auto group = c->split(r / 2, r % 2, fmt::format("group {}", r / 2));
    // key reverses the order inside a set: the new rank follows the key, not the parent rank.
    auto set = c->split(r % 2, 2 - r / 2, fmt::format("set {}", r % 2));
    ASSERT_EQ(group->size(), 2);
    EXPECT_EQ(group->rank(), r % 2);
    ASSERT_EQ(set->size(), 3);
    EXPECT_EQ(set->rank(), 2 - r / 2);
    std::vector<float> v = {static_cast<float>(r), 1.0f};
    group->all_reduce_sum(v);
    EXPECT_EQ(v[0], static_cast<float>(2 * (r / 2) * 2 + 1)) << "the sum of ranks 2g and 2g+1";
    EXPECT_EQ(v[1], 2.0f);
    // all_gather over the set: each member's value at its new rank.
    std::vector<float> mine = {static_cast<float>(r)}, all(3);
    set->all_gather(mine, all);
    for (int k = 0; k < 3; ++k) EXPECT_EQ(all[static_cast<size_t>(k)], static_cast<float>((2 - k) * 2 + r % 2));
    std::vector<float> w = {1.0f};
    c->all_reduce_sum(w);
    EXPECT_EQ(w[0], 6.0f);
    // A subgroup's error names the subgroup (shards of 5 over 3 are 2, 2, 1: 3 fits none).
    std::vector<float> in(5, 1.0f), out(3);
    try {
      set->reduce_scatter_sum(in, out);
      ADD_FAILURE() << "accepted a wrong shard size";
    } catch (const CollectiveError& e) {
      EXPECT_NE(std::string(e.what()).find(fmt::format("site oslo rank {}/6, set {} rank {}/3", r, r % 2, 2 - r / 2)),
                std::string::npos)
          << e.what();
    }
  });
}

TEST(Gloo, SplitRefusesANegativeColor) {
  const int port = test::fresh_port();
  test::run_ranks(2, [&](int r) {
    auto c = make_gloo(options("oslo", r, 2, port));
    EXPECT_THROW(c->split(-1, 0, "none"), CollectiveError);
  });
}

}  // namespace
}  // namespace geoloco::parallel

// Top-k sparsification: which values survive, both index formats, partial last blocks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "compression/synthetic.hpp"
#include "compression/topk.hpp"
#include "test_util.hpp"

using namespace geoloco;
using namespace geoloco::compression;
using namespace geoloco::compression::testing;

namespace {

// Reference: indices of the k largest |x| in [begin, end), ties to the lower index.
std::vector<size_t> reference_topk(std::span<const float> x, size_t begin, size_t end, size_t k) {
  std::vector<size_t> idx;
  for (size_t i = begin; i < end; ++i) idx.push_back(i);
  std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return std::fabs(x[a]) > std::fabs(x[b]); });
  idx.resize(k);
  std::sort(idx.begin(), idx.end());
  return idx;
}

}  // namespace

TEST(TopK, LayoutPicksTheSmallerIndexFormat) {
  // block 128: packed indices are 7 bits; the 16-byte bitmap wins (ties included) from k = 18.
  auto l = payload_layout(Codec::kFp32, 128, 17, 1000);
  EXPECT_FALSE(l.bitmap_full);
  EXPECT_EQ(l.index_bytes_full, 15u);  // ceil(17 * 7 / 8)
  l = payload_layout(Codec::kFp32, 128, 18, 1000);
  EXPECT_TRUE(l.bitmap_full);
  EXPECT_EQ(l.index_bytes_full, 16u);
  // Last block: 1000 - 7 * 128 = 104 elements keep ceil(18 * 104 / 128) = 15.
  EXPECT_EQ(l.last_len, 104u);
  EXPECT_EQ(l.kept_last, 15u);
  EXPECT_EQ(l.kept, 7u * 18 + 15);
  EXPECT_EQ(l.index_bytes_last, 13u);  // bitmap 13 bytes <= packed ceil(105 / 8) = 14
  EXPECT_TRUE(l.bitmap_last);
  EXPECT_EQ(l.index_bytes, 7u * 16 + 13);
  EXPECT_EQ(l.total, l.index_bytes + l.kept * 4);
}

TEST(TopK, KeepsExactlyTheLargestPerBlockInBothIndexFormats) {
  const auto x = synthetic_pseudo_gradient(1000, 5);  // last block is partial for every block size
  for (double frac : {0.01, 0.1, 0.3, 1.0}) {
    for (uint32_t block : {16u, 128u, 512u}) {
      const auto cfg = make_config(Codec::kFp32, block, frac);
      const auto y = round_trip(cfg, x);
      const auto l = payload_layout(Codec::kFp32, block, cfg.topk_per_block(), x.size());
      for (uint64_t b = 0; b < l.blocks; ++b) {
        const size_t begin = b * block, end = std::min<size_t>(x.size(), begin + block);
        const size_t k = b + 1 == l.blocks ? l.kept_last : l.kept_full;
        const auto keep = reference_topk(x, begin, end, k);
        size_t j = 0;
        for (size_t i = begin; i < end; ++i) {
          if (j < keep.size() && keep[j] == i) {
            ASSERT_EQ(y[i], x[i]) << "kept value changed, frac " << frac << " block " << block << " i " << i;
            ++j;
          } else {
            ASSERT_EQ(y[i], 0.0f) << "dropped value not zero, frac " << frac << " block " << block << " i " << i;
          }
        }
      }
    }
  }
}

TEST(TopK, TiesGoToTheLowerIndex) {
  std::vector<float> x(16, 1.0f);
  x[3] = -1.0f;  // same magnitude
  const auto y = round_trip(make_config(Codec::kFp32, 16, 0.25), x);  // keep 4
  const std::vector<float> want = {1, 1, 1, -1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  EXPECT_EQ(y, want);
}

TEST(TopK, QuantizedKeptValuesWithinBoundOfTheKeptAbsmax) {
  const auto x = synthetic_pseudo_gradient(4000, 8);
  const auto cfg = make_config(Codec::kInt8, 128, 0.1);
  const auto y = round_trip(cfg, x);
  for (size_t b = 0; b * 128 < x.size(); ++b) {
    const size_t begin = b * 128, end = std::min<size_t>(x.size(), begin + 128);
    double a = 0;
    for (size_t i = begin; i < end; ++i) a = std::max(a, std::fabs(double(x[i])));
    for (size_t i = begin; i < end; ++i)
      if (y[i] != 0.0f) {
        ASSERT_LE(std::fabs(double(x[i]) - y[i]), a / 127 / 2 * (1 + 0x1p-20)) << i;
      }
  }
}

TEST(TopK, SparseFrameIsSmaller) {
  const auto x = synthetic_pseudo_gradient(128 * 64, 2);
  std::vector<uint8_t> dense, sparse;
  round_trip(make_config(Codec::kInt8, 128), x, &dense);
  round_trip(make_config(Codec::kInt8, 128, 0.1), x, &sparse);
  // per block: 13 kept -> 12 bytes of 7-bit indices + 4 scale + 13 codes = 29 (vs 132 dense)
  EXPECT_EQ(sparse.size(), kHeaderBytes + kTrailerBytes + 64u * 29);
  EXPECT_EQ(dense.size(), kHeaderBytes + kTrailerBytes + 64u * 132);
}

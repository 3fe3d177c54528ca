// DistributedSampler: the contract in trainer/data/sampler.hpp, checked on exact indices.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "core/error.hpp"
#include "trainer/data/sampler.hpp"

using namespace geoloco;
using namespace geoloco::trainer;

namespace {

// Window i is (i*1000, i*1000 + 1, ...): the row says which window it came from.
class LabeledDataset final : public TokenDataset {
 public:
  explicit LabeledDataset(size_t windows) : windows_(windows) {}
  int vocab_size() const override { return 1 << 30; }
  size_t num_windows(int) const override { return windows_; }
  void window(size_t index, int T, int32_t* out) const override {
    if (index >= windows_) throw Error("window out of range");
    for (int t = 0; t <= T; ++t) out[t] = static_cast<int32_t>(index * 1000) + t;
  }
  std::string describe() const override { return "labeled"; }

 private:
  size_t windows_;
};

std::shared_ptr<const TokenDataset> labeled(size_t n) { return std::make_shared<LabeledDataset>(n); }

DistributedSampler make(size_t n, int world, int rank, uint64_t seed = 17, int T = 8, bool shuffle = true) {
  return DistributedSampler(labeled(n), SamplerOptions{seed, world, rank, T, shuffle});
}

}  // namespace

TEST(Sampler, EachRankTakesEveryWorldthPositionOfTheEpochPermutation) {
  const size_t N = 103;
  const int W = 4, B = 5;
  for (int g = 0; g < W; ++g) {
    auto s = make(N, W, g);
    EXPECT_EQ(s.samples_per_rank(), 25u);
    EXPECT_EQ(s.steps_per_epoch(B), 5u);
    for (size_t k = 0; k < 5; ++k) {
      auto idx = s.next_indices(B);
      for (size_t r = 0; r < B; ++r)
        EXPECT_EQ(idx[r], s.window_at(0, static_cast<uint64_t>(g) + W * (k * B + r))) << "rank " << g;
    }
    EXPECT_EQ(s.epoch(), 0u);
    s.next_indices(B);
    EXPECT_EQ(s.epoch(), 1u);  // the 6th batch starts epoch 1
    EXPECT_EQ(s.position(), static_cast<uint64_t>(B));
  }
}

TEST(Sampler, RanksAreDisjointAndCoverTheEpochMinusTheTail) {
  const size_t N = 103;
  const int W = 4, B = 5;
  std::multiset<size_t> seen;
  for (int g = 0; g < W; ++g) {
    auto s = make(N, W, g);
    for (size_t k = 0; k < s.steps_per_epoch(B); ++k)
      for (size_t i : s.next_indices(B)) seen.insert(i);
  }
  EXPECT_EQ(seen.size(), 100u);  // W * B * floor(N / (W*B))
  std::set<size_t> unique(seen.begin(), seen.end());
  EXPECT_EQ(unique.size(), 100u) << "a window was drawn by two ranks";
  EXPECT_LT(*unique.rbegin(), N);
  // The dropped tail is exactly the permutation's last 3 positions.
  auto s = make(N, W, 0);
  for (uint64_t p = 100; p < N; ++p) EXPECT_EQ(unique.count(s.window_at(0, p)), 0u);
}

TEST(Sampler, OneRankEpochIsAPermutationAndEpochsReshuffle) {
  const size_t N = 64;
  auto s = make(N, 1, 0);
  std::vector<size_t> e0, e1;
  for (size_t i = 0; i < N; ++i) e0.push_back(s.next_indices(1)[0]);
  for (size_t i = 0; i < N; ++i) e1.push_back(s.next_indices(1)[0]);
  EXPECT_EQ(s.epoch(), 1u);
  EXPECT_NE(e0, e1);
  std::vector<size_t> sorted0 = e0, sorted1 = e1;
  std::sort(sorted0.begin(), sorted0.end());
  std::sort(sorted1.begin(), sorted1.end());
  for (size_t i = 0; i < N; ++i) {
    EXPECT_EQ(sorted0[i], i);
    EXPECT_EQ(sorted1[i], i);
  }
  std::vector<size_t> identity(N);
  for (size_t i = 0; i < N; ++i) identity[i] = i;
  EXPECT_NE(e0, identity) << "shuffle is on";
}

TEST(Sampler, DeterministicGivenSeedAndSeedMatters) {
  auto a = make(500, 3, 1, 5), b = make(500, 3, 1, 5), c = make(500, 3, 1, 6);
  std::vector<size_t> xa, xb, xc;
  for (int k = 0; k < 100; ++k) {  // spans several epochs (500/3/7 = 23 batches each)
    auto ia = a.next_indices(7), ib = b.next_indices(7), ic = c.next_indices(7);
    xa.insert(xa.end(), ia.begin(), ia.end());
    xb.insert(xb.end(), ib.begin(), ib.end());
    xc.insert(xc.end(), ic.begin(), ic.end());
  }
  EXPECT_EQ(xa, xb);
  EXPECT_NE(xa, xc);
}

TEST(Sampler, NoShuffleIsStrided) {
  auto s = make(20, 3, 2, 1, 8, /*shuffle=*/false);
  EXPECT_EQ(s.next_indices(2), (std::vector<size_t>{2, 5}));
  EXPECT_EQ(s.next_indices(2), (std::vector<size_t>{8, 11}));
  EXPECT_EQ(s.next_indices(2), (std::vector<size_t>{14, 17}));
  EXPECT_EQ(s.next_indices(2), (std::vector<size_t>{2, 5}));  // 6 per rank: epoch 1
}

TEST(Sampler, NextBatchFillsInputsAndShiftedTargets) {
  const int T = 6, B = 3;
  auto s = make(50, 2, 1, 9, T);
  auto ref = make(50, 2, 1, 9, T);
  std::vector<int32_t> in(B * T), tg(B * T);
  for (int step = 0; step < 20; ++step) {
    s.next_batch(B, T, in.data(), tg.data());
    auto idx = ref.next_indices(B);
    for (size_t b = 0; b < B; ++b)
      for (size_t t = 0; t < T; ++t) {
        EXPECT_EQ(in[b * T + t], static_cast<int32_t>(idx[b] * 1000 + t));
        EXPECT_EQ(tg[b * T + t], static_cast<int32_t>(idx[b] * 1000 + t + 1));
      }
  }
  EXPECT_THROW(s.next_batch(B, T + 1, in.data(), tg.data()), Error);
}

TEST(Sampler, UnionOfNRanksEqualsOneRankWithNTimesTheBatch) {
  const size_t N = 1000;
  const int W = 4, B = 3, T = 5;
  std::vector<DistributedSampler> ranks;
  for (int g = 0; g < W; ++g) ranks.push_back(make(N, W, g, 77, T));
  auto one = make(N, 1, 0, 77, T);
  EXPECT_EQ(one.steps_per_epoch(W * B), ranks[0].steps_per_epoch(B));
  std::vector<int32_t> in(W * B * T), tg(W * B * T), in_g(B * T), tg_g(B * T);
  // 250 steps = 3 full epochs of 83 steps and a bit: covers the epoch boundaries.
  for (int step = 0; step < 250; ++step) {
    one.next_batch(W * B, T, in.data(), tg.data());
    for (int g = 0; g < W; ++g) {
      ranks[static_cast<size_t>(g)].next_batch(B, T, in_g.data(), tg_g.data());
      // Rank g's row r is the single rank's row g + W*r: same rows, so the same mean loss.
      for (int r = 0; r < B; ++r)
        for (int t = 0; t < T; ++t) {
          ASSERT_EQ(in_g[static_cast<size_t>(r * T + t)], in[static_cast<size_t>((g + W * r) * T + t)])
              << "step " << step << " rank " << g << " row " << r;
          ASSERT_EQ(tg_g[static_cast<size_t>(r * T + t)], tg[static_cast<size_t>((g + W * r) * T + t)]);
        }
    }
    for (int g = 0; g < W; ++g) EXPECT_EQ(ranks[static_cast<size_t>(g)].epoch(), one.epoch());
  }
  EXPECT_EQ(one.epoch(), 3u);
}

TEST(Sampler, SaveAndRestoreContinuesBitForBit) {
  for (int saved_after : {0, 1, 7, 16, 17, 40}) {  // 17 batches per epoch: include the boundary
    SCOPED_TRACE(saved_after);
    auto a = make(300, 2, 1, 3, 4);
    std::vector<int32_t> in(5 * 4), tg(5 * 4), in2(5 * 4), tg2(5 * 4);
    for (int k = 0; k < saved_after; ++k) a.next_batch(5, 4, in.data(), tg.data());
    const auto blob = a.state().to_bytes();
    EXPECT_EQ(blob.size(), 52u);
    auto b = make(300, 2, 1, 3, 4);
    b.restore(SamplerState::from_bytes(blob, "ckpt/sampler"));
    EXPECT_EQ(b.state(), a.state());
    for (int k = 0; k < 60; ++k) {
      a.next_batch(5, 4, in.data(), tg.data());
      b.next_batch(5, 4, in2.data(), tg2.data());
      ASSERT_EQ(in, in2) << "batch " << k << " after restore";
      ASSERT_EQ(tg, tg2);
    }
  }
}

TEST(Sampler, OneSavedStateRestoresEveryRank) {
  auto r0 = make(300, 3, 0), r2 = make(300, 3, 2), fresh2 = make(300, 3, 2);
  for (int k = 0; k < 30; ++k) {
    r0.next_indices(4);
    r2.next_indices(4);
  }
  fresh2.restore(r0.state());
  for (int k = 0; k < 30; ++k) EXPECT_EQ(fresh2.next_indices(4), r2.next_indices(4));
}

TEST(Sampler, RestoreRefusesAnotherRunsState) {
  auto a = make(300, 2, 0, 3, 4);
  a.next_indices(5);
  const auto st = a.state();
  EXPECT_THROW(make(300, 4, 0, 3, 4).restore(st), InputError);  // world
  EXPECT_THROW(make(300, 2, 0, 4, 4).restore(st), InputError);  // seed
  EXPECT_THROW(make(301, 2, 0, 3, 4).restore(st), InputError);  // dataset
  EXPECT_THROW(make(300, 2, 0, 3, 5).restore(st), InputError);  // seq_len
  auto bad = st;
  bad.position = 151;
  EXPECT_THROW(make(300, 2, 0, 3, 4).restore(bad), InputError);  // past the epoch
  try {
    make(300, 4, 0, 3, 4).restore(st);
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("saved world size 2 differs from this run's 4"), std::string::npos)
        << e.what();
  }
}

TEST(Sampler, CorruptStateBlobIsFileError) {
  auto blob = make(10, 1, 0).state().to_bytes();
  EXPECT_EQ(SamplerState::from_bytes(blob, "x"), make(10, 1, 0).state());
  auto shorter = blob;
  shorter.pop_back();
  EXPECT_THROW(SamplerState::from_bytes(shorter, "x"), FileError);
  auto magic = blob;
  magic[0] ^= 1;
  EXPECT_THROW(SamplerState::from_bytes(magic, "x"), FileError);
  auto version = blob;
  version[4] = 3;
  try {
    SamplerState::from_bytes(version, "ckpt.safetensors");
    FAIL();
  } catch (const FileError& e) {
    EXPECT_EQ(e.path(), "ckpt.safetensors");
    EXPECT_NE(std::string(e.what()).find("version 3"), std::string::npos);
  }
  auto v1_size = blob;  // version 1 says 48 bytes
  v1_size[4] = 1;
  EXPECT_THROW(SamplerState::from_bytes(v1_size, "x"), FileError);
  EXPECT_THROW(SamplerState::from_bytes({}, "x"), FileError);
}

TEST(Sampler, DatasetSmallerThanOneGlobalBatchIsInputError) {
  auto s = make(11, 4, 0);
  EXPECT_NO_THROW(s.next_indices(2));  // 4 * 2 = 8 <= 11
  auto t = make(11, 4, 0);
  try {
    t.next_indices(3);  // 12 > 11
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("fewer than one global batch of world 4 x micro_batch 3 = 12"),
              std::string::npos)
        << e.what();
  }
}

// ---- data.windows: random ------------------------------------------------------------------

namespace {

// Token k of the stream is k: a row's first token is where its window starts.
class CountingStream final : public TokenStream {
 public:
  explicit CountingStream(uint64_t n) : n_(n) {}
  uint64_t size() const override { return n_; }
  int vocab_size() const override { return 1 << 30; }
  void read(uint64_t begin, size_t count, int32_t* out) const override {
    if (begin + count > n_) throw Error("read past the stream");
    for (size_t i = 0; i < count; ++i) out[i] = static_cast<int32_t>(begin + i);
  }
  std::string describe() const override { return "counting"; }

 private:
  uint64_t n_;
};

DistributedSampler make_random(uint64_t tokens, int world, int rank, uint64_t seed = 17, int T = 8) {
  auto ds = std::make_shared<StreamDataset>(std::make_shared<CountingStream>(tokens));
  SamplerOptions o{seed, world, rank, T, true};
  o.random_offsets = true;
  return DistributedSampler(ds, o);
}

}  // namespace

// Each sampled window starts at its aligned start plus a shift in [0, T) drawn per (epoch,
// window): rows stay whole windows of the stream, every shift occurs, the last aligned window
// (no room to shift) is never drawn, and the same window gets other shifts in other epochs.
TEST(Sampler, RandomOffsetsShiftEveryWindowInsideTheStream) {
  const int T = 8;
  const uint64_t tokens = 8001;  // 1000 aligned windows; 999 drawn
  auto s = make_random(tokens, 1, 0, 5, T);
  EXPECT_EQ(s.num_windows(), 999u);
  std::vector<int32_t> in(10 * T), tg(10 * T);
  std::set<int> shifts;
  std::map<size_t, std::set<int>> per_window;
  for (int step = 0; step < 300; ++step) {  // 99 steps per epoch: three epochs
    const uint64_t e = s.epoch() + (s.position() + 10 > 999 ? 1 : 0);
    s.next_batch(10, T, in.data(), tg.data());
    for (int r = 0; r < 10; ++r) {
      const int32_t first = in[static_cast<size_t>(r * T)];
      const size_t w = static_cast<size_t>(first) / T;
      const int shift = first % T;
      ASSERT_LT(w, 999u);
      EXPECT_EQ(shift, s.shift_of(e, w));
      shifts.insert(shift);
      per_window[w].insert(shift);
      for (int t = 0; t < T; ++t) {
        ASSERT_EQ(in[static_cast<size_t>(r * T + t)], first + t);
        ASSERT_EQ(tg[static_cast<size_t>(r * T + t)], first + t + 1);
      }
      ASSERT_LE(static_cast<uint64_t>(first + T), tokens - 1);
    }
  }
  EXPECT_EQ(shifts.size(), static_cast<size_t>(T));
  size_t moved = 0;
  for (const auto& [w, sh] : per_window) moved += sh.size() > 1;
  EXPECT_GT(moved, per_window.size() / 2) << "epochs should shift a window differently";
  // Seeded: another seed, other shifts; the same seed, the same.
  auto a = make_random(tokens, 1, 0, 5, T), b = make_random(tokens, 1, 0, 6, T);
  int differ = 0;
  for (size_t w = 0; w < 100; ++w) differ += a.shift_of(0, w) != b.shift_of(0, w);
  EXPECT_GT(differ, 50);
  EXPECT_EQ(a.shift_of(2, 7), make_random(tokens, 1, 0, 5, T).shift_of(2, 7));
}

// The sampler contract holds with random offsets: W ranks together draw the rows one rank with
// W times the batch draws (shifts depend on the window, not the rank), and a saved state
// continues bit for bit.
TEST(Sampler, RandomOffsetsKeepTheUnionAndResumeProperties) {
  const int W = 3, B = 2, T = 6;
  const uint64_t tokens = 6001;
  std::vector<DistributedSampler> ranks;
  for (int g = 0; g < W; ++g) ranks.push_back(make_random(tokens, W, g, 9, T));
  auto one = make_random(tokens, 1, 0, 9, T);
  std::vector<int32_t> in(W * B * T), tg(W * B * T), in_g(B * T), tg_g(B * T);
  for (int step = 0; step < 400; ++step) {
    one.next_batch(W * B, T, in.data(), tg.data());
    for (int g = 0; g < W; ++g) {
      ranks[static_cast<size_t>(g)].next_batch(B, T, in_g.data(), tg_g.data());
      for (int r = 0; r < B; ++r)
        ASSERT_EQ(in_g[static_cast<size_t>(r * T)], in[static_cast<size_t>((g + W * r) * T)])
            << "step " << step << " rank " << g << " row " << r;
    }
  }
  auto a = make_random(tokens, 2, 1, 3, T);
  for (int k = 0; k < 37; ++k) a.next_indices(4);
  const auto blob = a.state().to_bytes();
  auto b = make_random(tokens, 2, 1, 3, T);
  b.restore(SamplerState::from_bytes(blob, "ckpt/sampler"));
  std::vector<int32_t> x(4 * T), y(4 * T), x2(4 * T), y2(4 * T);
  for (int k = 0; k < 100; ++k) {
    a.next_batch(4, T, x.data(), y.data());
    b.next_batch(4, T, x2.data(), y2.data());
    ASSERT_EQ(x, x2) << "batch " << k << " after restore";
  }
}

// A state saved with one window mode does not restore into the other; a version-1 state (from
// before data.windows) reads as aligned; random windows need a stream.
TEST(Sampler, RandomOffsetsStateIsCheckedAndNeedsAStream) {
  auto r = make_random(4001, 1, 0);
  r.next_indices(4);
  auto aligned = DistributedSampler(std::make_shared<StreamDataset>(std::make_shared<CountingStream>(4001)),
                                    SamplerOptions{17, 1, 0, 8, true});
  try {
    aligned.restore(r.state());
    ADD_FAILURE() << "a random-window state restored into an aligned sampler";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("saved with data.windows: random, this run has aligned"), std::string::npos)
        << e.what();
  }
  aligned.next_indices(4);
  auto v2 = aligned.state().to_bytes();
  std::vector<uint8_t> v1(v2.begin(), v2.end() - 4);
  v1[4] = 1;  // version 1: no random_offsets field
  const auto back = SamplerState::from_bytes(v1, "old/sampler");
  EXPECT_EQ(back.random_offsets, 0u);
  EXPECT_EQ(back.position, aligned.state().position);
  v2[v2.size() - 4] = 7;
  EXPECT_THROW(SamplerState::from_bytes(v2, "bad/sampler"), FileError);
  SamplerOptions o{17, 1, 0, 8, true};
  o.random_offsets = true;
  try {
    DistributedSampler(labeled(100), o);
    ADD_FAILURE() << "random windows over a non-stream dataset";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("data.windows: random needs windows cut from a token stream"),
              std::string::npos)
        << e.what();
  }
}

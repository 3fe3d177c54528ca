// The frame decoder trusts nothing: every header field, size, checksum and payload detail is
// checked, and each malformed frame raises FrameError with the right fault.
#include <gtest/gtest.h>
#include <zstd.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "compression/bytes.hpp"
#include "compression/synthetic.hpp"
#include "test_util.hpp"
#include "core/rng.hpp"

using namespace geoloco;
using namespace geoloco::compression;
using namespace geoloco::compression::testing;

namespace {

std::vector<uint8_t> encode(const PipelineConfig& cfg, std::span<const float> x) {
  Pipeline p(cfg);
  std::vector<uint8_t> f;
  p.encode(x, nullptr, f);
  return f;
}

// Recomputes the checksum so a deliberate corruption reaches the checks behind it.
void reseal(std::vector<uint8_t>& f) {
  const size_t body = f.size() - kTrailerBytes;
  bytes::store<uint64_t>(f.data() + body, frame_checksum({f.data(), body}));
}

std::optional<FrameFault> decode_fault(std::span<const uint8_t> f, uint64_t expected) {
  Pipeline p(make_config(Codec::kFp32));
  std::vector<float> out(expected);
  return fault_of([&] { p.decode(f, expected, out); });
}

template <class T>
std::vector<uint8_t> patched(std::vector<uint8_t> f, size_t offset, T value, bool reseal_it = false) {
  bytes::store<T>(f.data() + offset, value);
  if (reseal_it) reseal(f);
  return f;
}

const std::vector<float> kData = synthetic_pseudo_gradient(200, 4);

}  // namespace

TEST(Frame, HeaderFieldsAreValidated) {
  const auto f = encode(make_config(Codec::kInt8, 64), kData);
  EXPECT_EQ(decode_fault(f, 200), std::nullopt);
  EXPECT_EQ(decode_fault(patched<uint8_t>(f, 0, 'X'), 200), FrameFault::kMagic);
  EXPECT_EQ(decode_fault(patched<uint16_t>(f, 4, 3), 200), FrameFault::kVersion);
  EXPECT_EQ(decode_fault(patched<uint16_t>(f, 4, 0), 200), FrameFault::kVersion);
  EXPECT_EQ(decode_fault(patched<uint8_t>(f, 6, 7), 200), FrameFault::kCodec);
  EXPECT_EQ(decode_fault(patched<uint8_t>(f, 7, 4), 200), FrameFault::kFlags);
  EXPECT_EQ(decode_fault(patched<uint32_t>(f, 8, 8), 200), FrameFault::kBlock);
  EXPECT_EQ(decode_fault(patched<uint32_t>(f, 8, 68), 200), FrameFault::kBlock);
  EXPECT_EQ(decode_fault(patched<uint32_t>(f, 8, 65544), 200), FrameFault::kBlock);
  EXPECT_EQ(decode_fault(patched<uint32_t>(f, 12, 3), 200), FrameFault::kTopk);        // k without the flag
  EXPECT_EQ(decode_fault(patched<uint8_t>(f, 7, kFlagTopk), 200), FrameFault::kTopk);  // flag without k
  auto g = patched<uint8_t>(f, 7, kFlagTopk);
  EXPECT_EQ(decode_fault(patched<uint32_t>(g, 12, 65), 200), FrameFault::kTopk);  // k > block
  EXPECT_EQ(decode_fault(patched<uint64_t>(f, 24, 1), 200), FrameFault::kSize);   // raw_bytes
  EXPECT_EQ(decode_fault(patched<uint64_t>(f, 32, 1), 200), FrameFault::kSize);   // stored != raw
  EXPECT_EQ(decode_fault(patched<uint8_t>(f, f.size() - 1, f.back() ^ 1), 200), FrameFault::kChecksum);
  EXPECT_EQ(decode_fault(patched<uint8_t>(f, 100, f[100] ^ 0x10), 200), FrameFault::kChecksum);
}

TEST(Frame, ElementCountMustMatchTheShard) {
  const auto f = encode(make_config(Codec::kInt8, 64), kData);
  Pipeline p(make_config(Codec::kInt8));
  std::vector<float> out(100);
  try {
    p.decode(f, 100, out);
    FAIL() << "accepted a frame claiming more elements than the shard";
  } catch (const FrameError& e) {
    EXPECT_EQ(e.fault(), FrameFault::kElementCount);
    EXPECT_NE(std::string(e.what()).find("claims 200 elements, the shard expects 100 (more than the shard holds)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(decode_fault(f, 300), FrameFault::kElementCount);
  // A huge claim is refused before any size arithmetic or allocation.
  EXPECT_EQ(decode_fault(patched<uint64_t>(f, 16, ~uint64_t{0}), 200), FrameFault::kElementCount);
}

TEST(Frame, EveryTruncationAndExtensionIsRejected) {
  const auto f = encode(make_config(Codec::kInt4, 16, 0.3), kData);
  for (size_t len = 0; len < f.size(); ++len)
    ASSERT_TRUE(decode_fault(std::span(f).first(len), 200).has_value()) << "prefix " << len;
  auto longer = f;
  longer.push_back(0);
  EXPECT_EQ(decode_fault(longer, 200), FrameFault::kSize);
}

TEST(Frame, EveryBitFlipIsRejected) {
  for (const auto& cfg : {make_config(Codec::kInt4, 16, 0.3), make_config(Codec::kFp4, 32, std::nullopt, false, 3)}) {
    const auto x = std::vector<float>(4096, 0.5f);  // compressible, so the zstd frame is exercised
    auto f = encode(cfg, cfg.zstd_level ? std::span<const float>(x) : std::span<const float>(kData));
    const uint64_t n = cfg.zstd_level ? x.size() : kData.size();
    EXPECT_EQ(decode_fault(f, n), std::nullopt);
    for (size_t bit = 0; bit < f.size() * 8; ++bit) {
      f[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
      ASSERT_TRUE(decode_fault(f, n).has_value()) << cfg.describe() << " bit " << bit;
      f[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    }
  }
}

TEST(Frame, InvalidCodesAndScalesInsideAResealedPayload) {
  const size_t P = kHeaderBytes;
  // int8: 4 scales (200 / 64 -> 4 blocks) then codes.
  const auto f8 = encode(make_config(Codec::kInt8, 64), kData);
  EXPECT_EQ(decode_fault(patched<uint8_t>(f8, P + 16 + 10, 0x80, true), 200), FrameFault::kPayload);  // -128
  EXPECT_EQ(decode_fault(patched<float>(f8, P + 4, -1.0f, true), 200), FrameFault::kPayload);
  EXPECT_EQ(decode_fault(patched<float>(f8, P + 4, -0.0f, true), 200), FrameFault::kPayload);
  EXPECT_EQ(decode_fault(patched<float>(f8, P + 4, std::numeric_limits<float>::quiet_NaN(), true), 200),
            FrameFault::kPayload);
  EXPECT_EQ(decode_fault(patched<float>(f8, P + 4, std::numeric_limits<float>::infinity(), true), 200),
            FrameFault::kPayload);
  EXPECT_EQ(decode_fault(patched<float>(f8, P + 4, 0x1p65f, true), 200), FrameFault::kPayload);
  EXPECT_EQ(decode_fault(patched<float>(f8, P + 4, 0x1p64f, true), 200), std::nullopt);  // largest legal scale
  // int4: code 0 (= -8) never emitted; 201 elements leave a padding nibble.
  const auto f4 = encode(make_config(Codec::kInt4, 64), kData);
  EXPECT_EQ(decode_fault(patched<uint8_t>(f4, P + 16 + 3, 0x88 & 0xf0, true), 200), FrameFault::kPayload);
  std::vector<float> odd(kData);
  odd.push_back(0.1f);
  const auto f4o = encode(make_config(Codec::kInt4, 64), odd);
  const size_t last = f4o.size() - kTrailerBytes - 1;
  EXPECT_EQ(decode_fault(patched<uint8_t>(f4o, last, f4o[last] | 0x10, true), 201), FrameFault::kPayload);
  // int2: 201 codes leave 3 padding pairs.
  const auto f2o = encode(make_config(Codec::kInt2, 64), odd);
  const size_t last2 = f2o.size() - kTrailerBytes - 1;
  EXPECT_EQ(decode_fault(patched<uint8_t>(f2o, last2, f2o[last2] | 0x40, true), 201), FrameFault::kPayload);
  // fp4: code 8 is negative zero.
  const auto ff = encode(make_config(Codec::kFp4, 64), kData);
  EXPECT_EQ(decode_fault(patched<uint8_t>(ff, P + 16, 0x88, true), 200), FrameFault::kPayload);
  // fp32 / fp16 / bf16: non-finite values.
  const auto f32 = encode(make_config(Codec::kFp32), kData);
  EXPECT_EQ(decode_fault(patched<float>(f32, P + 40, std::numeric_limits<float>::infinity(), true), 200),
            FrameFault::kPayload);
  const auto f16 = encode(make_config(Codec::kFp16), kData);
  EXPECT_EQ(decode_fault(patched<uint16_t>(f16, P + 2, 0x7c00, true), 200), FrameFault::kPayload);
  const auto fb = encode(make_config(Codec::kBf16), kData);
  EXPECT_EQ(decode_fault(patched<uint16_t>(fb, P + 2, 0xffc0, true), 200), FrameFault::kPayload);
}

TEST(Frame, InvalidTopkIndices) {
  const size_t P = kHeaderBytes;
  // block 128, k = 13: packed 7-bit indices, 12 bytes per block.
  std::vector<float> x(256);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 128);  // keeps 115..127 per block
  const auto f = encode(make_config(Codec::kFp32, 128, 0.1), x);
  EXPECT_EQ(decode_fault(f, 256), std::nullopt);
  auto g = f;
  g[P] = static_cast<uint8_t>((g[P] & 0x80) | 127);  // first index 127, the second (116) is then not ascending
  reseal(g);
  EXPECT_EQ(decode_fault(g, 256), FrameFault::kPayload);
  // Last partial block: 96 elements keep ceil(13 * 96 / 128) = 10 -> 70 bits in 9 bytes (bitmap: 12);
  // the 2 padding bits must be 0.
  std::vector<float> y(224, 1.0f);
  const auto h = encode(make_config(Codec::kFp32, 128, 0.1), y);
  EXPECT_EQ(decode_fault(h, 224), std::nullopt);
  const size_t pad_byte = P + 12 + 8;
  EXPECT_EQ(decode_fault(patched<uint8_t>(h, pad_byte, h[pad_byte] | 0x80, true), 224), FrameFault::kPayload);
  // Bitmap format (k = 64 of 128): popcount must equal k, and no bits past the block end.
  const auto b = encode(make_config(Codec::kFp32, 128, 0.5), x);
  EXPECT_EQ(decode_fault(b, 256), std::nullopt);
  EXPECT_EQ(decode_fault(patched<uint8_t>(b, P, b[P] ^ 1, true), 256), FrameFault::kPayload);
  std::vector<float> z(132, 1.0f);  // last block of 4: bitmap 1 byte, only its low 4 bits may be set
  const auto c = encode(make_config(Codec::kFp32, 128, 0.5), z);
  const size_t lastmap = P + 16;
  EXPECT_EQ(decode_fault(patched<uint8_t>(c, lastmap, c[lastmap] | 0x20, true), 132), FrameFault::kPayload);
}

TEST(Frame, ZstdIsUsedOnlyWhenItPaysAndBoundedByTheHeader) {
  const std::vector<float> zeros(4096, 0.0f);
  Pipeline p(make_config(Codec::kFp32, 128, std::nullopt, false, 3));
  std::vector<uint8_t> f;
  const FrameInfo info = p.encode(zeros, nullptr, f);
  EXPECT_TRUE(info.zstd);
  EXPECT_LT(f.size(), 200u);
  std::vector<float> out(4096, 1.0f);
  p.decode(f, 4096, out);
  EXPECT_EQ(out, zeros);
  // Incompressible (uniformly random finite bit patterns): stored raw, the flag stays clear.
  std::vector<float> noise(4096);
  Rng rng(1);
  for (float& v : noise) {
    do {
      v = std::bit_cast<float>(static_cast<uint32_t>(rng.next_u64()));
    } while (!(std::fabs(v) <= 0x1p64f));
  }
  EXPECT_FALSE(p.encode(noise, nullptr, f).zstd);
  EXPECT_EQ(f.size(), kHeaderBytes + kTrailerBytes + 4096 * 4);

  // A zstd frame that would expand to 1 MiB inside a frame whose layout needs 16 KiB.
  std::vector<uint8_t> big(1 << 20, 0);
  std::vector<uint8_t> bomb(ZSTD_compressBound(big.size()));
  bomb.resize(ZSTD_compress(bomb.data(), bomb.size(), big.data(), big.size(), 3));
  auto g = encode(make_config(Codec::kFp32, 128, std::nullopt, false, 3), zeros);
  g.resize(kHeaderBytes);
  g.insert(g.end(), bomb.begin(), bomb.end());
  g.resize(g.size() + kTrailerBytes);
  bytes::store<uint64_t>(g.data() + 32, bomb.size());
  reseal(g);
  EXPECT_EQ(decode_fault(g, 4096), FrameFault::kZstd);
  // Not a zstd frame at all, and a zstd flag on a payload that is not smaller than raw.
  auto h = f;  // the noise frame, raw
  h[7] = kFlagZstd;
  EXPECT_EQ(decode_fault(h, 4096), FrameFault::kSize);
  bytes::store<uint64_t>(h.data() + 32, 100);
  h.resize(kHeaderBytes + 100 + kTrailerBytes);
  reseal(h);
  EXPECT_EQ(decode_fault(h, 4096), FrameFault::kZstd);
}

TEST(Frame, DecodeAddSumsInOrderAndLeavesTheSumAloneOnError) {
  // Four sites, each with its own data; every site decodes all frames in rank order.
  const size_t n = 3000;
  std::vector<std::vector<uint8_t>> frames(4);
  for (int s = 0; s < 4; ++s) {
    Pipeline p(make_config(Codec::kInt4, 128, std::nullopt, false, 3));
    p.encode(synthetic_pseudo_gradient(n, 100 + s), nullptr, frames[s]);
  }
  std::vector<std::vector<float>> sums(4, std::vector<float>(n, 0.0f));
  for (int site = 0; site < 4; ++site) {
    Pipeline p(make_config(Codec::kInt4));
    for (int s = 0; s < 4; ++s) p.decode_add(frames[s], n, sums[site]);
  }
  for (int site = 1; site < 4; ++site)
    EXPECT_EQ(std::memcmp(sums[0].data(), sums[site].data(), n * 4), 0) << "site " << site;
  // The same as decoding each and adding in fp32 in rank order.
  Pipeline p(make_config(Codec::kFp32));
  std::vector<float> ref(n, 0.0f), tmp(n);
  for (int s = 0; s < 4; ++s) {
    p.decode(frames[s], n, tmp);
    for (size_t i = 0; i < n; ++i) ref[i] += tmp[i];
  }
  EXPECT_EQ(std::memcmp(ref.data(), sums[0].data(), n * 4), 0);
  auto bad = frames[2];
  bad[kHeaderBytes + 3] ^= 1;
  const auto before = sums[0];
  EXPECT_THROW(p.decode_add(bad, n, sums[0]), FrameError);
  EXPECT_EQ(sums[0], before);
}

TEST(Frame, InspectAndCrossCodecDecode) {
  const auto f = encode(make_config(Codec::kBf16, 64, 0.5, false, 0), kData);
  const FrameInfo info = Pipeline::inspect(f, 200);
  EXPECT_EQ(info.codec, Codec::kBf16);
  EXPECT_TRUE(info.topk);
  EXPECT_FALSE(info.zstd);
  EXPECT_EQ(info.elements, 200u);
  EXPECT_EQ(info.frame_bytes, f.size());
  // 4 blocks (3 x 64 + 8): bitmaps 8,8,8,1 bytes; kept 32,32,32,4 -> 100 bf16 codes.
  EXPECT_EQ(info.raw_bytes, 25u + 200u);
  // Any pipeline decodes any valid frame: the frame describes itself.
  Pipeline other(make_config(Codec::kInt2, 1024, std::nullopt, false, 9));
  std::vector<float> out(200);
  EXPECT_NO_THROW(other.decode(f, 200, out));
}

TEST(Frame, WireTotalsForTheSummary) {
  Pipeline p(make_config(Codec::kInt8, 128));
  std::vector<uint8_t> f;
  p.encode(std::vector<float>(1280, 1.0f), nullptr, f);
  p.encode(std::vector<float>(1280, 2.0f), nullptr, f);
  const WireTotals& t = p.encoded_totals();
  EXPECT_EQ(t.frames, 2u);
  EXPECT_EQ(t.elements, 2560u);
  EXPECT_EQ(t.frame_bytes, 2u * (48 + 40 + 1280));
  EXPECT_DOUBLE_EQ(t.ratio(), 2560.0 * 4 / (2 * 1368));
  WireTotals all;
  all += t;
  all += t;
  EXPECT_EQ(all.frames, 4u);
  EXPECT_EQ(all.frame_bytes, 4u * 1368);
  EXPECT_DOUBLE_EQ(all.ratio(), t.ratio());
}

TEST(Frame, ClaimsBeyondTheElementLimitAreRefusedEvenWhenExpected) {
  // inspect() needs no output buffer, so even an absurd shard size reaches the limit check.
  const uint64_t huge = kMaxElements + 1;
  auto f = encode(make_config(Codec::kInt8, 64), kData);
  bytes::store<uint64_t>(f.data() + 16, huge);
  EXPECT_EQ(fault_of([&] { Pipeline::inspect(f, huge); }), FrameFault::kElementCount);
}

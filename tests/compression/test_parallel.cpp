// compression.threads: a frame's work on several threads (parallel.hpp; top-k by block ranges
// too) gives the same bytes,
// the same error-feedback residual and the same decoded values whatever the thread count;
// zstd payloads in 1 MiB chunks (frame version 2) round-trip, version-1 frames (one zstd
// frame) still decode, and a chunk list that does not fill the payload is refused.
#include <gtest/gtest.h>
#include <zstd.h>

#include <algorithm>
#include <cstring>

#include "compression/bytes.hpp"
#include "compression/parallel.hpp"
#include "compression/synthetic.hpp"
#include "compression/values.hpp"
#include "compression/zstd_stage.hpp"
#include "test_util.hpp"

using namespace geoloco;
using namespace geoloco::compression;
using namespace geoloco::compression::testing;

namespace {

PipelineConfig codec_config(Codec codec, bool ef, int zstd, int threads, uint32_t block = 128) {
  PipelineConfig c = make_config(codec, block);
  c.error_feedback = ef;
  c.zstd_level = zstd;
  c.threads = threads;
  return c;
}

void reseal(std::vector<uint8_t>& f) {
  const size_t body = f.size() - kTrailerBytes;
  bytes::store<uint64_t>(f.data() + body, frame_checksum({f.data(), body}));
}

}  // namespace

TEST(CodecThreads, FramesResidualsAndDecodesDoNotDependOnTheThreadCount) {
  // 6 element chunks, a partial block at the end; int8 with zstd spans 2 zstd chunks.
  const size_t n = 5 * (size_t{1} << 18) + 1000 + 17;
  const auto x = synthetic_pseudo_gradient(n, 11);
  for (Codec codec : {Codec::kFp32, Codec::kFp16, Codec::kBf16, Codec::kInt8, Codec::kInt4, Codec::kFp4, Codec::kInt2})
    for (int zstd : {0, 3})
      for (bool ef : {false, true}) {
        if (ef && codec == Codec::kFp32) continue;
        for (std::optional<double> topk : {std::optional<double>(), std::optional<double>(0.1)}) {
          if (topk && (codec == Codec::kFp32 || zstd == 0)) continue;  // top-k rows: the lossy codecs, zstd on
          std::vector<uint8_t> ref_frame;
          std::vector<float> ref_residual, ref_decoded;
          for (int threads : {1, 2, 3, 8}) {
            const std::string what = fmt::format("{} zstd {} ef {} top-k {} threads {}", codec_name(codec), zstd, ef,
                                                 topk.value_or(1.0), threads);
            PipelineConfig pc = codec_config(codec, ef, zstd, threads);
            pc.topk = topk;
            Pipeline p(pc);
            std::vector<float> residual(n, 0.0f);
            for (size_t i = 0; i < n; i += 7) residual[i] = 1e-4f * static_cast<float>(i % 13);
            std::vector<uint8_t> frame;
            if (ef)
              p.encode_with_residual(x, residual, frame);
            else
              p.encode(x, nullptr, frame);
            std::vector<float> decoded(n);
            p.decode(frame, n, decoded);
            if (threads == 1) {
              ref_frame = frame;
              ref_residual = residual;
              ref_decoded = decoded;
              if (zstd && codec == Codec::kInt8 && !topk) {
                const FrameInfo info = Pipeline::inspect(frame, n);
                EXPECT_TRUE(info.zstd) << what;
                EXPECT_GT(info.raw_bytes, kZstdChunkBytes) << what << ": spans several zstd chunks";
              }
              continue;
            }
            EXPECT_EQ(frame, ref_frame) << what;
            EXPECT_EQ(std::memcmp(residual.data(), ref_residual.data(), n * 4), 0) << what;
            EXPECT_EQ(std::memcmp(decoded.data(), ref_decoded.data(), n * 4), 0) << what;
          }
        }
      }
}

TEST(CodecThreads, AVersionOneFrameWithOneZstdFrameStillDecodes) {
  // A frame as version 1 wrote it: the raw payload (2.3 MiB) as one zstd frame.
  const size_t n = 2400000;
  const auto x = synthetic_pseudo_gradient(n, 5);
  Pipeline plain(codec_config(Codec::kInt8, false, 0, 1));
  std::vector<uint8_t> raw_frame;
  plain.encode(x, nullptr, raw_frame);
  std::vector<float> want(n);
  plain.decode(raw_frame, n, want);
  const size_t raw = raw_frame.size() - kHeaderBytes - kTrailerBytes;
  std::vector<uint8_t> z(ZSTD_compressBound(raw));
  const size_t zn = ZSTD_compress(z.data(), z.size(), raw_frame.data() + kHeaderBytes, raw, 3);
  ASSERT_FALSE(ZSTD_isError(zn));
  std::vector<uint8_t> v1(raw_frame.begin(), raw_frame.begin() + kHeaderBytes);
  bytes::store<uint16_t>(v1.data() + 4, 1);
  v1[7] |= kFlagZstd;
  bytes::store<uint64_t>(v1.data() + 32, zn);
  v1.insert(v1.end(), z.begin(), z.begin() + static_cast<std::ptrdiff_t>(zn));
  v1.resize(v1.size() + kTrailerBytes);
  reseal(v1);
  for (int threads : {1, 4}) {
    Pipeline p(codec_config(Codec::kInt8, false, 3, threads));
    std::vector<float> got(n);
    p.decode(v1, n, got);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), n * 4), 0) << threads;
    // The same bytes labelled version 2 are one chunk where three are due: refused.
    auto v2 = v1;
    bytes::store<uint16_t>(v2.data() + 4, 2);
    reseal(v2);
    EXPECT_EQ(fault_of([&] { p.decode(v2, n, got); }), FrameFault::kZstd) << threads;
  }
}

TEST(CodecThreads, AChunkListThatDoesNotFillThePayloadIsRefused) {
  const size_t n = 2400000;
  const auto x = synthetic_pseudo_gradient(n, 6);
  Pipeline p(codec_config(Codec::kInt8, false, 3, 2));
  std::vector<uint8_t> f;
  p.encode(x, nullptr, f);
  ASSERT_TRUE(Pipeline::inspect(f, n).zstd);
  std::vector<float> out(n);
  // Trailing bytes after the last chunk (stored_bytes grown to cover them).
  auto g = f;
  g.insert(g.end() - kTrailerBytes, {0, 0, 0, 0});
  bytes::store<uint64_t>(g.data() + 32, bytes::load<uint64_t>(f.data() + 32) + 4);
  reseal(g);
  EXPECT_EQ(fault_of([&] { p.decode(g, n, out); }), FrameFault::kZstd);
  // The last chunk cut off.
  const size_t first = zstd_frame_size({f.data() + kHeaderBytes, f.size() - kHeaderBytes - kTrailerBytes});
  std::vector<uint8_t> h(f.begin(), f.begin() + static_cast<std::ptrdiff_t>(kHeaderBytes + first));
  bytes::store<uint64_t>(h.data() + 32, first);
  h.resize(h.size() + kTrailerBytes);
  reseal(h);
  EXPECT_EQ(fault_of([&] { p.decode(h, n, out); }), FrameFault::kZstd);
}

TEST(CodecThreads, ParallelForRunsEveryTaskAndRethrowsTheLowestFailure) {
  for (int threads : {1, 2, 5}) {
    std::vector<int> hit(37, 0);
    parallel_for(hit.size(), threads, [&](size_t i, int w) {
      EXPECT_LT(w, threads);
      hit[i] += 1;
    });
    EXPECT_EQ(hit, std::vector<int>(37, 1)) << threads;
    try {
      parallel_for(10, threads, [](size_t i, int) {
        if (i == 3 || i == 7) throw Error(fmt::format("task {}", i));
      });
      ADD_FAILURE() << "no throw";
    } catch (const Error& e) {
      EXPECT_STREQ(e.what(), "task 3") << threads;
    }
  }
}

// A frame encoded at an offset (room for the caller's header, outer_optimizer's envelope) is the
// frame encoded alone, byte for byte, after the kept prefix; the residual is the same; and
// max_frame_bytes bounds every frame: every codec, top-k, error feedback, zstd on and off.
TEST(FrameAtOffset, IsTheFrameAfterTheKeptPrefixAndWithinItsBound) {
  for (const Codec codec : {Codec::kFp32, Codec::kBf16, Codec::kInt8, Codec::kInt4, Codec::kInt2})
    for (const bool ef : {false, true})
      for (const int zstd : {0, 3}) {
        SCOPED_TRACE(::testing::Message() << codec_name(codec) << " ef " << ef << " zstd " << zstd);
        const size_t n = 70001;
        const auto x = synthetic_pseudo_gradient(n, 77);
        PipelineConfig pc = codec_config(codec, ef, zstd, 2);
        Pipeline a(pc), b(pc);
        std::vector<float> ra(ef ? n : 0, 0.0f), rb(ef ? n : 0, 0.0f);
        std::vector<uint8_t> alone, at(48, 0x5a);
        if (ef) {
          a.encode_with_residual(x, ra, alone);
          b.encode_with_residual(x, rb, at, 48);
        } else {
          a.encode(x, nullptr, alone);
          b.encode(x, nullptr, at, 48);
        }
        ASSERT_EQ(at.size(), 48 + alone.size());
        EXPECT_TRUE(std::all_of(at.begin(), at.begin() + 48, [](uint8_t v) { return v == 0x5a; }));
        EXPECT_TRUE(std::equal(alone.begin(), alone.end(), at.begin() + 48));
        EXPECT_EQ(ra, rb);
        EXPECT_LE(alone.size(), a.max_frame_bytes(n));
        if (zstd == 0) {
          EXPECT_EQ(alone.size(), a.max_frame_bytes(n));
        }
      }
  PipelineConfig topk = codec_config(Codec::kInt8, false, 0, 1);
  topk.topk = 0.1;
  Pipeline p(topk);
  std::vector<uint8_t> f;
  p.encode(synthetic_pseudo_gradient(5000, 3), nullptr, f);
  EXPECT_EQ(f.size(), p.max_frame_bytes(5000));
}

// A payload quantized elsewhere (a GPU: trainer/cuda/quantize_kernel.hpp, bit-identical to
// encode_values) framed by encode_staged: the very frame encode() makes of the same values,
// with and without zstd, on any thread count; wrong sizes and codecs it cannot frame refused.
TEST(StagedPayload, FramesAsEncodeDoes) {
  for (const Codec codec : {Codec::kInt8, Codec::kInt4, Codec::kFp4, Codec::kInt2})
    for (const size_t n : {size_t{5}, size_t{1000}, size_t{300017}})
      for (const int zstd : {0, 1})
        for (const int threads : {1, 2}) {
          SCOPED_TRACE(::testing::Message()
                       << codec_name(codec) << " n=" << n << " zstd " << zstd << " threads " << threads);
          const auto x = synthetic_pseudo_gradient(n, 1000 + n);
          Pipeline ref(codec_config(codec, false, zstd, 1)), staged(codec_config(codec, false, zstd, threads));
          std::vector<uint8_t> want, got, scratch;
          ref.encode(x, nullptr, want);
          const PayloadLayout layout = payload_layout(codec, 128, 0, n);
          std::vector<uint8_t> scales(layout.scales_bytes), codes(layout.codes_bytes);
          encode_values(codec, x, 128, scales.data(), codes.data(), scratch);
          const FrameInfo info = staged.encode_staged(scales, codes, n, got);
          EXPECT_EQ(got, want);
          EXPECT_EQ(info.frame_bytes, want.size());
          EXPECT_EQ(staged.encoded_totals().frames, 1u);
        }
  Pipeline p(codec_config(Codec::kInt4, false, 1, 1));
  std::vector<uint8_t> out;
  const PayloadLayout l = payload_layout(Codec::kInt4, 128, 0, 1000);
  try {
    p.encode_staged(std::vector<uint8_t>(l.scales_bytes), std::vector<uint8_t>(l.codes_bytes + 1), 1000, out);
    ADD_FAILURE() << "a payload of the wrong size was framed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("staged payload of 32 scale and 501 code bytes"), std::string::npos)
        << e.what();
  }
  for (PipelineConfig c : {codec_config(Codec::kFp16, false, 0, 1), codec_config(Codec::kInt8, false, 0, 1)}) {
    if (c.codec == Codec::kInt8) c.topk = 0.1;
    Pipeline q(c);
    EXPECT_THROW(q.encode_staged({}, {}, 0, out), Error) << c.describe();
  }
}

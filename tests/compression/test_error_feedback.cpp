// Error feedback: the transmitted sum tracks the true sum; the residual stays bounded and
// survives a checkpoint round trip.
#include <gtest/gtest.h>

#include <cmath>

#include "compression/synthetic.hpp"
#include "test_util.hpp"

using namespace geoloco;
using namespace geoloco::compression;
using namespace geoloco::compression::testing;

namespace {

struct Tracking {
  double rel_error_of_sum = 0;  // ||sum decoded - sum true|| / ||sum true||
  double max_residual = 0;      // max |r_i| after the last round
  double identity_gap = 0;      // max |sum true - sum decoded - r| (exact up to rounding)
  double identity_tol = 0;      // what float rounding allows for identity_gap
};

// Runs `rounds` outer steps of fresh pseudo-gradients through one pipeline.
Tracking track(const PipelineConfig& cfg, size_t n, int rounds) {
  Pipeline p(cfg);
  ErrorFeedback ef(n);
  std::vector<double> truth(n, 0.0), sent(n, 0.0);
  std::vector<uint8_t> frame;
  std::vector<float> out(n);
  double max_corrected = 0;
  for (int r = 0; r < rounds; ++r) {
    const auto g = synthetic_pseudo_gradient(n, 1000 + r, 64);
    for (size_t i = 0; i < n; ++i) max_corrected = std::max(max_corrected, std::fabs(double(g[i]) + ef.residual()[i]));
    p.encode(g, cfg.error_feedback ? &ef : nullptr, frame);
    p.decode(frame, n, out);
    for (size_t i = 0; i < n; ++i) {
      truth[i] += g[i];
      sent[i] += out[i];
    }
  }
  Tracking t;
  // Each round rounds g + r and (g + r) - decoded to float: <= 2 half-ulps of max |g + r|.
  t.identity_tol = rounds * 0x1p-23 * max_corrected;
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    num += (sent[i] - truth[i]) * (sent[i] - truth[i]);
    den += truth[i] * truth[i];
    t.max_residual = std::max(t.max_residual, std::fabs(double(ef.residual()[i])));
    t.identity_gap = std::max(t.identity_gap, std::fabs(truth[i] - sent[i] - ef.residual()[i]));
  }
  t.rel_error_of_sum = std::sqrt(num / den);
  return t;
}

}  // namespace

TEST(ErrorFeedback, TransmittedSumTracksTheTrueSum) {
  const size_t n = 4096;
  const int rounds = 200;
  for (const auto& [codec, topk] : std::vector<std::pair<Codec, std::optional<double>>>{{Codec::kInt8, std::nullopt},
                                                                                        {Codec::kInt4, std::nullopt},
                                                                                        {Codec::kInt2, std::nullopt},
                                                                                        {Codec::kFp4, std::nullopt},
                                                                                        {Codec::kInt8, 0.1},
                                                                                        {Codec::kFp32, 0.05}}) {
    const auto with = track(make_config(codec, 128, topk, true), n, rounds);
    const auto without = track(make_config(codec, 128, topk, false), n, rounds);
    SCOPED_TRACE(make_config(codec, 128, topk, true).describe());
    // sum true - sum sent == final residual, up to the float rounding of each round.
    EXPECT_LE(with.identity_gap, with.identity_tol);
    // The residual is one step's dropped part, not an accumulation: bounded by a few
    // pseudo-gradient magnitudes (values are ~1e-3 * lognormal * t3; 1.0 is ~100x that).
    EXPECT_LT(with.max_residual, 1.0);
    // With feedback the sum's error is far below the error without it.
    EXPECT_LT(with.rel_error_of_sum, 0.3 * without.rel_error_of_sum)
        << "with " << with.rel_error_of_sum << " without " << without.rel_error_of_sum;
  }
}

TEST(ErrorFeedback, Int8ResidualStaysWithinHalfAScale) {
  // For int8 every residual is the quantization error of (g + r): <= s/2 of that block.
  const size_t n = 1024;
  Pipeline p(make_config(Codec::kInt8, 128, std::nullopt, true));
  ErrorFeedback ef(n);
  std::vector<uint8_t> frame;
  for (int r = 0; r < 50; ++r) {
    const auto g = synthetic_pseudo_gradient(n, 77 + r, 64);
    std::vector<float> corrected(n);
    for (size_t i = 0; i < n; ++i) corrected[i] = g[i] + ef.residual()[i];
    p.encode(g, &ef, frame);
    for (size_t b = 0; b < n / 128; ++b) {
      double a = 0;
      for (size_t i = b * 128; i < (b + 1) * 128; ++i) a = std::max(a, std::fabs(double(corrected[i])));
      for (size_t i = b * 128; i < (b + 1) * 128; ++i)
        ASSERT_LE(std::fabs(ef.residual()[i]), a / 127 / 2 * (1 + 0x1p-18)) << "round " << r << " i " << i;
    }
  }
}

TEST(ErrorFeedback, LosslessPipelineLeavesZeroResidual) {
  Pipeline p(make_config(Codec::kFp32, 128, std::nullopt, true));
  ErrorFeedback ef(500);
  std::vector<uint8_t> frame;
  p.encode(synthetic_pseudo_gradient(500, 1), &ef, frame);
  for (float r : ef.residual()) ASSERT_EQ(r, 0.0f);
}

TEST(ErrorFeedback, MisuseAndNonFiniteLeaveTheResidualUntouched) {
  Pipeline p(make_config(Codec::kInt8, 128, std::nullopt, true));
  std::vector<uint8_t> frame;
  std::vector<float> g(300, 0.25f);
  EXPECT_THROW(p.encode(g, nullptr, frame), Error);  // config says feedback: a residual is required
  ErrorFeedback wrong(299);
  EXPECT_THROW(p.encode(g, &wrong, frame), Error);
  ErrorFeedback ef(300);
  p.encode(std::vector<float>(300, 0.1f), &ef, frame);
  const auto before = std::vector<float>(ef.residual().begin(), ef.residual().end());
  g[17] = std::nanf("");
  try {
    p.encode(g, &ef, frame);
    FAIL() << "accepted NaN";
  } catch (const EncodeError& e) {
    EXPECT_EQ(e.index(), 17u);
    EXPECT_NE(std::string(e.what()).find("error-feedback residual"), std::string::npos) << e.what();
  }
  EXPECT_EQ(std::vector<float>(ef.residual().begin(), ef.residual().end()), before);
}

TEST(ErrorFeedback, CheckpointRoundTripAndCorruption) {
  Pipeline p(make_config(Codec::kInt4, 64, std::nullopt, true));
  ErrorFeedback ef(1000);
  std::vector<uint8_t> frame;
  p.encode(synthetic_pseudo_gradient(1000, 3), &ef, frame);
  const auto blob = ef.save();
  EXPECT_EQ(blob.size(), 16u + 4000 + 8);
  EXPECT_EQ(ef.bytes().size(), 4000u);
  const auto back = ErrorFeedback::load(blob, 1000, "ckpt/ef.bin");
  EXPECT_EQ(std::memcmp(back.residual().data(), ef.residual().data(), 4000), 0);

  // Resuming from the loaded residual produces the same next frame as continuing.
  ErrorFeedback resumed = back;
  std::vector<uint8_t> f1, f2;
  Pipeline p2(make_config(Codec::kInt4, 64, std::nullopt, true));
  const auto g = synthetic_pseudo_gradient(1000, 4);
  p.encode(g, &ef, f1);
  p2.encode(g, &resumed, f2);
  EXPECT_EQ(f1, f2);

  auto expect_file_error = [&](std::vector<uint8_t> b, uint64_t n, const std::string& what) {
    try {
      ErrorFeedback::load(b, n, "ckpt/ef.bin");
      FAIL() << "accepted: " << what;
    } catch (const FileError& e) {
      EXPECT_EQ(e.path(), "ckpt/ef.bin");
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  expect_file_error(blob, 999, "holds 1000 elements, the shard has 999");
  expect_file_error(std::vector<uint8_t>(blob.begin(), blob.begin() + 30), 1000, "30 bytes, 1000 elements need");
  auto bad = blob;
  bad[0] = 'X';
  expect_file_error(bad, 1000, "bad magic");
  bad = blob;
  bad[100] ^= 1;
  expect_file_error(bad, 1000, "checksum mismatch");
  expect_file_error({}, 0, "too short");
}

// error_feedback_decay (SparseLoCo's accumulator e = beta * e + delta): what is encoded is the
// pseudo-gradient plus beta times the residual, and the new residual is that minus what the
// frame decodes to; the encoded part of parts of a shard (encode_with_residual) matches.
TEST(ErrorFeedback, DecayScalesTheResidualBeforeItIsAdded) {
  PipelineConfig cfg;
  cfg.codec = Codec::kFp32;
  cfg.block = 16;
  cfg.topk = 0.25;  // 4 of 16 kept: the rest goes to the residual
  cfg.error_feedback = true;
  cfg.error_feedback_decay = 0.5;
  Pipeline p(cfg);
  const size_t n = 32;
  ErrorFeedback ef(n);
  std::vector<float> g(n), out(n);
  for (size_t i = 0; i < n; ++i) g[i] = static_cast<float>((i % 7) + 1) * (i % 2 ? -0.125f : 0.25f);
  std::vector<uint8_t> frame;
  p.encode(g, &ef, frame);  // residual starts at zero: plain top-k
  const std::vector<float> r1(ef.residual().begin(), ef.residual().end());
  p.encode(g, &ef, frame);
  p.decode(frame, n, out);
  for (size_t i = 0; i < n; ++i) {
    const float corrected = g[i] + 0.5f * r1[i];
    EXPECT_EQ(ef.residual()[i], corrected - out[i]) << i;
    // A kept element is sent exactly (fp32), so its residual is zero; a dropped one keeps it all.
    EXPECT_TRUE(out[i] == corrected || out[i] == 0.0f) << i;
  }
  // The same two rounds over the two halves as parts (encode_with_residual) give the same bytes.
  Pipeline q(cfg);
  std::vector<float> res(n, 0.0f);
  std::vector<uint8_t> fa, fb;
  for (int round = 0; round < 2; ++round) {
    q.encode_with_residual(std::span<const float>(g.data(), 16), std::span<float>(res.data(), 16), fa);
    q.encode_with_residual(std::span<const float>(g.data() + 16, 16), std::span<float>(res.data() + 16, 16), fb);
  }
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(res[i], ef.residual()[i]) << i;
  PipelineConfig bad = cfg;
  bad.error_feedback_decay = 0.0;
  EXPECT_THROW(bad.validate(), ConfigError);
  EXPECT_NE(cfg.describe().find("/ef0.5"), std::string::npos) << cfg.describe();
}

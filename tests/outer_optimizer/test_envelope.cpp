#include <gtest/gtest.h>

#include "outer_optimizer/envelope.hpp"

using namespace geoloco::outer;

namespace {
std::vector<uint8_t> make(uint64_t round, uint32_t site, uint32_t rank, std::vector<uint8_t> body) {
  std::vector<uint8_t> out;
  write_envelope({EnvelopeKind::kPseudoGradient, round, site, rank, 42, body, {}}, out);
  return out;
}
std::string reject(std::span<const uint8_t> b, uint64_t round = 5, uint64_t max_body = 16) {
  try {
    read_envelope(b, EnvelopeKind::kPseudoGradient, round, 1, 0, max_body, "lyon/0");
  } catch (const EnvelopeError& e) {
    return e.what();
  }
  return "<accepted>";
}
}  // namespace

TEST(Envelope, RoundTrip) {
  auto b = make(5, 1, 0, {1, 2, 3});
  auto e = read_envelope(b, EnvelopeKind::kPseudoGradient, 5, 1, 0, 16, "lyon/0");
  EXPECT_EQ(e.value, 42u);
  EXPECT_EQ(std::vector<uint8_t>(e.body.begin(), e.body.end()), (std::vector<uint8_t>{1, 2, 3}));
}

TEST(Envelope, RejectsEveryMismatch) {
  auto good = make(5, 1, 0, {1, 2, 3});
  EXPECT_NE(reject(std::span(good).first(10)).find("shorter than the 48-byte envelope"), std::string::npos);
  auto bad = good;
  bad[0] = 'X';
  EXPECT_NE(reject(bad).find("bad magic"), std::string::npos);
  bad = good;
  bad[4] = 9;
  EXPECT_NE(reject(bad).find("version 9 (expected 3: every site must run the same geoloco)"), std::string::npos);
  bad = good;
  bad[4] = 1;  // a version-1 envelope (40 bytes, no attachment) from an older geoloco
  bad.resize(40);
  EXPECT_NE(reject(bad).find("version 1 (expected 3"), std::string::npos);
  bad = good;
  bad[6] = 2;
  EXPECT_NE(reject(bad).find("kind 2"), std::string::npos);
  EXPECT_NE(reject(make(4, 1, 0, {1})).find("round 4 (expected 5: replayed"), std::string::npos);
  EXPECT_NE(reject(make(5, 2, 0, {1})).find("claims site 2"), std::string::npos);
  EXPECT_NE(reject(make(5, 1, 0, std::vector<uint8_t>(17))).find("exceeds the 16"), std::string::npos);
  bad = good;
  bad.pop_back();  // truncated body
  EXPECT_NE(reject(bad).find("body length 3 and attachment 0 but 2 bytes arrived"), std::string::npos);
  EXPECT_NE(reject(good).find("<accepted>"), std::string::npos);
  EXPECT_NE(reject(make(4, 1, 0, {1})).find("outer round 5: message from lyon/0 rejected"), std::string::npos);
}

// A pseudo-gradient's attachment travels after the body and comes back apart from it.
TEST(Envelope, AnAttachmentRoundTripsAndIsBoundsChecked) {
  const std::vector<uint8_t> body = {1, 2, 3}, att = {'{', '}'};
  std::vector<uint8_t> b;
  write_envelope({EnvelopeKind::kPseudoGradient, 5, 1, 0, 42, body, att}, b);
  EXPECT_EQ(b.size(), kEnvelopeBytes + 5);
  auto e = read_envelope(b, EnvelopeKind::kPseudoGradient, 5, 1, 0, 16, "lyon/0");
  EXPECT_EQ(std::vector<uint8_t>(e.body.begin(), e.body.end()), body);
  EXPECT_EQ(std::vector<uint8_t>(e.attachment.begin(), e.attachment.end()), att);
  // No attachment: empty.
  auto plain = make(5, 1, 0, {1, 2, 3});
  EXPECT_TRUE(read_envelope(plain, EnvelopeKind::kPseudoGradient, 5, 1, 0, 16, "lyon/0").attachment.empty());
  // An attachment length past the bytes that arrived, past the cap.
  auto bad = b;
  bad[40] = 9;
  EXPECT_NE(reject(bad).find("body length 3 and attachment 9 but 5 bytes arrived"), std::string::npos);
  bad = b;
  bad[42] = 0x10;  // 1 MiB
  EXPECT_NE(reject(bad).find("attachment of 1048578 bytes exceeds the 65536 allowed"), std::string::npos);
  // Version 3: a pseudo-gradient's field at 44 is its site's step time (outer.pace: time);
  // version 2 (still read: a checkpoint's saved contribution) kept it reserved, zero.
  bad = b;
  bad[44] = 1;
  EXPECT_EQ(read_envelope(bad, EnvelopeKind::kPseudoGradient, 5, 1, 0, 16, "lyon/0").step_us, 1u);
  bad[4] = 2;
  EXPECT_NE(reject(bad).find("reserved field not zero"), std::string::npos);
  bad[44] = 0;
  EXPECT_EQ(read_envelope(bad, EnvelopeKind::kPseudoGradient, 5, 1, 0, 16, "lyon/0").step_us, 0u);
  // Any other kind keeps it reserved.
  std::vector<uint8_t> h;
  write_envelope({EnvelopeKind::kWeightsHash, 5, 1, 0, 7, {}, {}}, h);
  h[44] = 1;
  EXPECT_THROW(read_envelope(h, EnvelopeKind::kWeightsHash, 5, 1, 0, 0, "lyon/0"), EnvelopeError);
  Envelope timed{EnvelopeKind::kPseudoGradient, 5, 1, 0, 42, body, {}};
  timed.step_us = 123456;
  write_envelope(timed, h);
  EXPECT_EQ(read_envelope(h, EnvelopeKind::kPseudoGradient, 5, 1, 0, 16, "lyon/0").step_us, 123456u);
  timed.kind = EnvelopeKind::kWeightsHash;
  EXPECT_THROW(write_envelope(timed, h), geoloco::Error);
  // The writer refuses an attachment over the cap.
  std::vector<uint8_t> big(kMaxAttachment + 1);
  EXPECT_THROW(write_envelope({EnvelopeKind::kPseudoGradient, 5, 1, 0, 42, body, big}, b), geoloco::Error);
}

// outer.exchange: owner: an owner's average carries the mask of the sites it averaged; it is
// not a pseudo-gradient, nor the other way round.
TEST(Envelope, AnAverageIsItsOwnKind) {
  std::vector<uint8_t> b;
  write_envelope({EnvelopeKind::kAverage, 5, 1, 0, 0b111, std::vector<uint8_t>{7, 8}, {}}, b);
  const auto e = read_envelope(b, EnvelopeKind::kAverage, 5, 1, 0, 16, "lyon/0");
  EXPECT_EQ(e.value, 0b111u);
  EXPECT_EQ(e.body.size(), 2u);
  EXPECT_NE(reject(b).find("kind 13 (expected 1)"), std::string::npos);
  auto pg = make(5, 1, 0, {1});
  EXPECT_THROW(read_envelope(pg, EnvelopeKind::kAverage, 5, 1, 0, 16, "lyon/0"), EnvelopeError);
}

// seal_envelope around a body already in place (a frame encoded at offset kEnvelopeBytes) makes
// write_envelope's bytes, attachment and step time included; a buffer without room for the
// header is refused.
TEST(Envelope, SealedAroundABodyInPlaceIsTheWrittenEnvelope) {
  const std::vector<uint8_t> body{9, 8, 7, 6, 5}, attachment{1, 2, 3};
  for (const bool with_attachment : {false, true}) {
    Envelope e{EnvelopeKind::kPseudoGradient,
               7,
               2,
               1,
               99,
               body,
               with_attachment ? std::span<const uint8_t>(attachment) : std::span<const uint8_t>()};
    e.step_us = 1234;
    std::vector<uint8_t> want;
    write_envelope(e, want);
    std::vector<uint8_t> got(kEnvelopeBytes + body.size(), 0xee);
    std::copy(body.begin(), body.end(), got.begin() + kEnvelopeBytes);
    e.body = {};
    seal_envelope(e, got);
    EXPECT_EQ(got, want) << "attachment " << with_attachment;
  }
  std::vector<uint8_t> short_buf(kEnvelopeBytes - 1);
  EXPECT_THROW(seal_envelope(Envelope{}, short_buf), geoloco::Error);
}

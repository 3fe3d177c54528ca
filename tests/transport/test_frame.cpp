#include <gtest/gtest.h>

#include "transport/frame.hpp"

using namespace geoloco::transport;

namespace {
FrameHeader good(uint64_t offset, uint64_t length, uint64_t total) {
  FrameHeader h;
  h.kind = static_cast<uint16_t>(FrameKind::kPseudoGradient);
  h.round = 7;
  h.shard = 3;
  h.offset = offset;
  h.length = length;
  h.total_length = total;
  h.checksum = 0x1122334455667788ull;
  return h;
}
}  // namespace

TEST(Frame, EncodeDecodeRoundTripAndLayout) {
  FrameHeader h = good(4096, 100, 4196);
  uint8_t buf[kFrameHeaderBytes];
  h.encode(buf);
  // Layout is little-endian and fixed: magic at 0, offset at 24, checksum at 48.
  EXPECT_EQ(buf[0], 'G');
  EXPECT_EQ(buf[1], 'L');
  EXPECT_EQ(buf[2], 'T');
  EXPECT_EQ(buf[3], 'F');
  EXPECT_EQ(buf[24], 0x00);
  EXPECT_EQ(buf[25], 0x10);
  EXPECT_EQ(buf[48], 0x88);
  auto d = FrameHeader::decode(std::span<const uint8_t>(buf, kFrameHeaderBytes));
  ASSERT_TRUE(d);
  EXPECT_EQ(d->round, 7u);
  EXPECT_EQ(d->shard, 3u);
  EXPECT_EQ(d->offset, 4096u);
  EXPECT_EQ(d->length, 100u);
  EXPECT_EQ(d->total_length, 4196u);
  EXPECT_EQ(d->checksum, h.checksum);
  EXPECT_FALSE(FrameHeader::decode(std::span<const uint8_t>(buf, kFrameHeaderBytes - 1)));
}

TEST(Frame, ChunkCount) {
  EXPECT_EQ(chunk_count(0, 10), 1u);
  EXPECT_EQ(chunk_count(1, 10), 1u);
  EXPECT_EQ(chunk_count(10, 10), 1u);
  EXPECT_EQ(chunk_count(11, 10), 2u);
}

TEST(Frame, ValidateHeaderNamesTheBadField) {
  const uint64_t chunk = 4096, max = 1 << 20;
  EXPECT_EQ(validate_header(good(0, 4096, 5000), 4096, chunk, max), "");
  EXPECT_EQ(validate_header(good(4096, 904, 5000), 904, chunk, max), "");
  EXPECT_EQ(validate_header(good(0, 0, 0), 0, chunk, max), "");
  auto h = good(0, 4096, 5000);
  h.magic = 1;
  EXPECT_NE(validate_header(h, 4096, chunk, max).find("magic"), std::string::npos);
  h = good(0, 4096, 5000);
  h.version = 9;
  EXPECT_NE(validate_header(h, 4096, chunk, max).find("version: got 9"), std::string::npos);
  h = good(0, 4096, 5000);
  h.kind = 99;
  EXPECT_NE(validate_header(h, 4096, chunk, max).find("kind"), std::string::npos);
  h.kind = 7;  // one past the last kind (6: an owner's average)
  EXPECT_NE(validate_header(h, 4096, chunk, max).find("kind: got 7"), std::string::npos);
  h.kind = static_cast<uint16_t>(FrameKind::kAverage);
  EXPECT_EQ(validate_header(h, 4096, chunk, max), "");
  EXPECT_EQ(to_string(FrameKind::kAverage), "average");
  EXPECT_NE(validate_header(good(0, 4096, 2 << 20), 4096, chunk, max).find("total_length"), std::string::npos);
  EXPECT_NE(validate_header(good(100, 4096, 5000), 4096, chunk, max).find("offset"), std::string::npos);
  EXPECT_NE(validate_header(good(8192, 100, 5000), 100, chunk, max).find("offset"), std::string::npos);
  EXPECT_NE(validate_header(good(0, 5000, 5000), 5000, chunk, max).find("length"), std::string::npos);
  EXPECT_NE(validate_header(good(4096, 903, 5000), 903, chunk, max).find("length"), std::string::npos);
  // Header and message disagree (truncated payload).
  EXPECT_NE(validate_header(good(0, 4096, 5000), 4000, chunk, max).find("truncated"), std::string::npos);
  EXPECT_NE(validate_header(good(0, 1, 0), 1, chunk, max), "");
}

TEST(Frame, ChecksumIsXxh3OfTheBytes) {
  std::vector<uint8_t> a = {1, 2, 3}, b = {1, 2, 4};
  EXPECT_EQ(chunk_checksum(a), chunk_checksum(a));
  EXPECT_NE(chunk_checksum(a), chunk_checksum(b));
}

// The join wire (outer_optimizer/join_wire.hpp): manifests and fetch requests round-trip, and
// every malformed one is refused with a JoinError naming the donor and what is wrong.
#include <gtest/gtest.h>

#include <cstring>

#include "outer_optimizer/join_wire.hpp"

using namespace geoloco::outer;

namespace {

std::vector<uint8_t> state(size_t n) {
  std::vector<uint8_t> s(n);
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<uint8_t>(i * 7 + 3);
  return s;
}

std::string refusal(std::span<const uint8_t> bytes, int sites = 3) {
  try {
    decode_manifest(bytes, sites, "paris/0");
  } catch (const JoinError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(JoinWire, ManifestRoundTripsAndCutsTheStateIntoChunks) {
  const auto s = state(3 * 4096 + 5);
  const JoinManifest m = describe_state(s, 4096, 17, 170, 0b101, 0xABCDull);
  EXPECT_EQ(m.chunks(), 4u);
  EXPECT_EQ(m.chunk_size(3), 5u);
  EXPECT_EQ(m.chunk_size(0), 4096u);
  const JoinManifest back = decode_manifest(encode_manifest(m), 3, "paris/0");
  EXPECT_TRUE(back.same_state(m));
  EXPECT_EQ(back.round, 17u);
  EXPECT_EQ(back.step, 170);
  EXPECT_EQ(back.members, 0b101u);
  // Another state differs in its hashes.
  auto t = s;
  t[5000] ^= 1;
  EXPECT_FALSE(describe_state(t, 4096, 17, 170, 0b101, 0xABCDull).same_state(m));
}

TEST(JoinWire, MalformedManifestsAreRefusedNamingTheDonor) {
  const auto good = encode_manifest(describe_state(state(10000), 4096, 1, 10, 0b11, 1));
  ASSERT_EQ(refusal(good), "");
  auto with = [&](size_t off, uint32_t v) {
    auto b = good;
    std::memcpy(b.data() + off, &v, 4);
    return b;
  };
  EXPECT_NE(refusal(std::span(good).first(20)).find("shorter than"), std::string::npos);
  EXPECT_NE(refusal(with(0, 0x11223344)).find("bad magic"), std::string::npos);
  EXPECT_NE(refusal(with(4, 9)).find("version"), std::string::npos);
  EXPECT_NE(refusal(with(40, 100)).find("chunk size"), std::string::npos);
  EXPECT_NE(refusal(with(44, 7)).find("cannot hold"), std::string::npos);
  EXPECT_NE(refusal(with(44, kMaxJoinChunks + 1)).find("chunks (at most"), std::string::npos);
  EXPECT_NE(refusal(with(24, 0b1000)).find("outside the config"), std::string::npos);  // site 3 of 3
  auto truncated = good;
  truncated.pop_back();
  EXPECT_NE(refusal(truncated).find("chunk hashes"), std::string::npos);
  EXPECT_NE(refusal(with(0, 0)).find("paris/0"), std::string::npos);
}

TEST(JoinWire, FetchRequestsAreBoundsChecked) {
  const auto f = decode_fetch(encode_fetch({2, 5}), 5, "lyon/0");
  EXPECT_EQ(f.begin, 2u);
  EXPECT_EQ(f.end, 5u);
  EXPECT_TRUE(decode_fetch(encode_fetch({}), 5, "lyon/0").done());
  EXPECT_THROW(decode_fetch(encode_fetch({2, 6}), 5, "lyon/0"), JoinError);  // past the last chunk
  EXPECT_THROW(decode_fetch(encode_fetch({3, 3}), 5, "lyon/0"), JoinError);  // empty range
  EXPECT_THROW(decode_fetch(std::vector<uint8_t>(7), 5, "lyon/0"), JoinError);
}

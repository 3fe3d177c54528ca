#include <gtest/gtest.h>

#include "transport/handshake.hpp"

using namespace geoloco::transport;

namespace {
HsMessage hello() {
  HsMessage m;
  m.type = HsType::kHello;
  m.run_id = "run-42";
  m.config_hash = 0xABCDEF;
  m.chunk_bytes = 4096;
  m.lanes = 2;
  m.lane = 1;
  m.site = "paris";
  m.rank = 3;
  m.nonce.fill(0x5A);
  return m;
}
HsTranscript tr() {
  HsTranscript t;
  t.run_id = "run-42";
  t.config_hash = 1;
  t.dialer_site = "a";
  t.listener_site = "b";
  t.dialer_nonce.fill(1);
  t.listener_nonce.fill(2);
  return t;
}
}  // namespace

TEST(Handshake, HelloRoundTrip) {
  auto bytes = hello().encode();
  auto d = decode_handshake(bytes, kProtocolVersion);
  ASSERT_TRUE(d.msg) << d.error;
  EXPECT_EQ(d.msg->run_id, "run-42");
  EXPECT_EQ(d.msg->config_hash, 0xABCDEFu);
  EXPECT_EQ(d.msg->site, "paris");
  EXPECT_EQ(d.msg->rank, 3);
  EXPECT_EQ(d.msg->lane, 1);
  EXPECT_EQ(d.msg->nonce, hello().nonce);
}

TEST(Handshake, MalformedMessagesAreRefusedWithReason) {
  auto bytes = hello().encode();
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    auto d = decode_handshake(std::span<const uint8_t>(bytes.data(), cut), kProtocolVersion);
    EXPECT_FALSE(d.msg) << "cut " << cut;
    EXPECT_NE(d.error, "");
  }
  auto extra = bytes;
  extra.push_back(0);
  EXPECT_FALSE(decode_handshake(extra, kProtocolVersion).msg);
  auto magic = bytes;
  magic[0] ^= 1;
  EXPECT_NE(decode_handshake(magic, kProtocolVersion).error.find("magic"), std::string::npos);
  std::vector<uint8_t> huge(kMaxHandshakeBytes + 1, 0);
  EXPECT_NE(decode_handshake(huge, kProtocolVersion).error.find("exceeds"), std::string::npos);
  // A site string longer than allowed is refused, not truncated.
  auto m = hello();
  m.site = std::string(kMaxSiteBytes + 1, 'x');
  EXPECT_FALSE(decode_handshake(m.encode(), kProtocolVersion).msg);
}

TEST(Handshake, VersionMismatchIsNamedAndRejectIsAlwaysReadable) {
  auto m = hello();
  m.version = 9;
  auto d = decode_handshake(m.encode(), kProtocolVersion);
  EXPECT_FALSE(d.msg);
  EXPECT_EQ(d.error, "protocol version mismatch: peer speaks 9, we speak 2");
  HsMessage rej;
  rej.version = 9;
  rej.type = HsType::kReject;
  rej.reason = "config hash mismatch";
  auto r = decode_handshake(rej.encode(), kProtocolVersion);
  ASSERT_TRUE(r.msg);
  EXPECT_EQ(r.msg->reason, "config hash mismatch");
}

TEST(Handshake, MacBindsKeyRoleNoncesAndIdentities) {
  std::vector<uint8_t> k1(16, 'k'), k2(16, 'k');
  k2[15] = 'j';
  auto t = tr();
  Mac m = compute_mac(k1, t, "dialer");
  EXPECT_TRUE(mac_equal(m, compute_mac(k1, t, "dialer")));
  EXPECT_FALSE(mac_equal(m, compute_mac(k2, t, "dialer")));
  EXPECT_FALSE(mac_equal(m, compute_mac(k1, t, "listener")));
  auto t2 = t;
  t2.listener_nonce[0] ^= 1;
  EXPECT_FALSE(mac_equal(m, compute_mac(k1, t2, "dialer")));
  t2 = t;
  t2.dialer_rank = 1;
  EXPECT_FALSE(mac_equal(m, compute_mac(k1, t2, "dialer")));
  t2 = t;
  t2.lane = 1;
  EXPECT_FALSE(mac_equal(m, compute_mac(k1, t2, "dialer")));
  EXPECT_NE(random_nonce(), random_nonce());
}

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tests/support/temp_dir.hpp"
#include "transport/transport_config.hpp"

using namespace geoloco;
using namespace geoloco::transport;

using geoloco::test::TempDir;

namespace {
std::string err(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "<no error>";
}
}  // namespace

TEST(TransportConfig, ParsesWithDefaultsAndOverrides) {
  TempDir d;
  d.file("k.psk", "0123456789abcdef-secret\n");
  auto doc = config::load_string(
      "transport:\n  psk_file: k.psk\n  timeout_s: 20\n  transfer_timeout_s: 90\n  lanes: 3\n"
      "  emulate: {delay_ms: 20, rate_mbit: 1000}\n",
      "run.yaml");
  auto c = TransportConfig::from_yaml(doc.node().child("transport"), d.str());
  EXPECT_EQ(c.psk.size(), 23u);  // trailing newline stripped
  EXPECT_DOUBLE_EQ(c.connect_timeout_s, 20);
  EXPECT_DOUBLE_EQ(c.handshake_timeout_s, 10);
  EXPECT_DOUBLE_EQ(c.transfer_timeout_s, 90);
  EXPECT_EQ(c.lanes, 3);
  EXPECT_EQ(c.chunk_bytes, 4u << 20);
  EXPECT_EQ(c.eager_bytes, 8u << 20);
  EXPECT_DOUBLE_EQ(c.emulate.delay_ms, 20);
  EXPECT_TRUE(c.emulate.enabled());
  EXPECT_EQ(c.psk_file, (d.path() / "k.psk").string());
}

TEST(TransportConfig, KeyFileErrorsAreLocatedAndNeverPrintTheKey) {
  TempDir d;
  d.file("short.psk", "tooshort");
  auto doc = config::load_string("transport:\n  psk_file: short.psk\n", "run.yaml");
  auto m = err([&] { TransportConfig::from_yaml(doc.node().child("transport"), d.str()); });
  EXPECT_NE(m.find("run.yaml:2"), std::string::npos) << m;
  EXPECT_NE(m.find("8 bytes, need at least 16"), std::string::npos) << m;
  EXPECT_EQ(m.find("tooshort"), std::string::npos) << m;
  auto doc2 = config::load_string("transport:\n  psk_file: missing.psk\n", "run.yaml");
  m = err([&] { TransportConfig::from_yaml(doc2.node().child("transport"), d.str()); });
  EXPECT_NE(m.find("does not exist"), std::string::npos) << m;
  auto doc3 = config::load_string("transport:\n  lanes: 2\n", "run.yaml");
  m = err([&] { TransportConfig::from_yaml(doc3.node().child("transport"), d.str()); });
  EXPECT_NE(m.find("psk_file"), std::string::npos) << m;
}

TEST(TransportConfig, RangesAndUnknownKeys) {
  TempDir d;
  d.file("k.psk", "0123456789abcdef");
  auto bad = [&](const std::string& extra) {
    auto doc = config::load_string("transport:\n  psk_file: k.psk\n" + extra, "run.yaml");
    return err([&] { TransportConfig::from_yaml(doc.node().child("transport"), d.str()); });
  };
  EXPECT_NE(bad("  lanes: 0\n").find("transport.lanes"), std::string::npos);
  EXPECT_NE(bad("  chunk_bytes: 10\n").find("transport.chunk_bytes"), std::string::npos);
  EXPECT_NE(bad("  connect_timeout_s: -1\n").find("connect_timeout_s"), std::string::npos);
  EXPECT_NE(bad("  lane: 2\n").find("transport.lane: unknown key"), std::string::npos) << bad("  lane: 2\n");
  EXPECT_NE(bad("  emulate: {delay: 3}\n").find("delay"), std::string::npos);
  EXPECT_NE(bad("  eager_bytes: -1\n").find("transport.eager_bytes"), std::string::npos) << bad("  eager_bytes: -1\n");
  EXPECT_NE(bad("  eager_bytes: 67108865\n").find("transport.eager_bytes"), std::string::npos);
  auto doc = config::load_string("transport:\n  psk_file: k.psk\n  eager_bytes: 0\n", "run.yaml");
  EXPECT_EQ(TransportConfig::from_yaml(doc.node().child("transport"), d.str()).eager_bytes, 0u);
  TransportConfig c;
  c.psk = std::vector<uint8_t>(16, 1);
  c.eager_bytes = kMaxEagerBytes + 1;
  EXPECT_NE(err([&] { c.validate(); }).find("eager_bytes"), std::string::npos);
}

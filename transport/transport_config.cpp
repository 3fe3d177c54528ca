// The `transport:` config section and its key file (transport_config.hpp).
#include "transport/transport_config.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

namespace geoloco::transport {

std::vector<uint8_t> read_psk_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    throw FileError(path, "key file does not exist or is not a regular file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw FileError(path, fmt::format("cannot open key file: {}", std::strerror(errno)));
  std::vector<uint8_t> key;
  char c;
  while (in.get(c)) {
    key.push_back(static_cast<uint8_t>(c));
    if (key.size() > kMaxPskBytes + 2) break;
  }
  if (in.bad()) throw FileError(path, "error reading key file");
  if (!key.empty() && key.back() == '\n') key.pop_back();
  if (!key.empty() && key.back() == '\r') key.pop_back();
  // Only sizes are reported, never the key bytes.
  if (key.size() < kMinPskBytes)
    throw FileError(path, fmt::format("key is {} bytes, need at least {}", key.size(), kMinPskBytes));
  if (key.size() > kMaxPskBytes) throw FileError(path, fmt::format("key is longer than {} bytes", kMaxPskBytes));
  return key;
}

TransportConfig TransportConfig::from_yaml(const config::Node& node, const std::string& config_dir) {
  TransportConfig c;
  std::string psk = node.require<std::string>("psk_file");
  if (psk.empty()) node.fail("psk_file", "must name a key file");
  std::filesystem::path p(psk);
  if (p.is_relative() && !config_dir.empty()) p = std::filesystem::path(config_dir) / p;
  c.psk_file = p.lexically_normal().string();
  try {
    c.psk = read_psk_file(c.psk_file);
  } catch (const FileError& e) {
    node.fail("psk_file", e.what());
  }
  double t = node.get_double("timeout_s", 60, 0.01, 86400);
  c.connect_timeout_s = node.get_double("connect_timeout_s", t, 0.01, 86400);
  c.handshake_timeout_s = node.get_double("handshake_timeout_s", std::min(t, 10.0), 0.01, 86400);
  c.transfer_timeout_s = node.get_double("transfer_timeout_s", t, 0.01, 86400);
  c.lanes = static_cast<int>(node.get_int("lanes", 1, 1, 64));
  c.chunk_bytes = static_cast<uint64_t>(node.get_int("chunk_bytes", 4 << 20, 4096, 1ll << 30));
  c.inflight_chunks = static_cast<int>(node.get_int("inflight_chunks", 8, 1, 1024));
  c.eager_bytes = static_cast<uint64_t>(node.get_int("eager_bytes", 8 << 20, 0, static_cast<int64_t>(kMaxEagerBytes)));
  c.max_message_bytes = static_cast<uint64_t>(node.get_int("max_message_bytes", 16ll << 30, 0, 1ll << 40));
  // Reading an absent child throws YAML::InvalidNode in core today (reported), so the
  // emulate mapping is only read when present; its defaults are the struct's.
  if (node.has("emulate")) {
    auto em = node.child("emulate");
    c.emulate.delay_ms = em.get_double("delay_ms", 0, 0, 10000);
    c.emulate.rate_mbit = em.get_double("rate_mbit", 0, 0, 1e6);
    em.finish();
  }
  node.finish();
  c.validate();
  return c;
}

void TransportConfig::validate() const {
  auto bad = [](const std::string& m) { throw ConfigError("transport: " + m); };
  if (psk.size() < kMinPskBytes)
    bad(fmt::format("pre-shared key has {} bytes, need at least {}", psk.size(), kMinPskBytes));
  if (!(connect_timeout_s > 0) || !(handshake_timeout_s > 0) || !(transfer_timeout_s > 0)) bad("timeouts must be > 0");
  if (lanes < 1 || lanes > 64) bad(fmt::format("lanes {} not in [1, 64]", lanes));
  if (chunk_bytes < 1 || chunk_bytes > (1ull << 30)) bad(fmt::format("chunk_bytes {} not in [1, 1 GiB]", chunk_bytes));
  if (inflight_chunks < 1) bad("inflight_chunks must be >= 1");
  if (eager_bytes > kMaxEagerBytes) bad(fmt::format("eager_bytes {} not in [0, {}]", eager_bytes, kMaxEagerBytes));
  if (emulate.delay_ms < 0 || emulate.rate_mbit < 0) bad("emulate values must be >= 0");
}

}  // namespace geoloco::transport

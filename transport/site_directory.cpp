// The site directory's wire form (site_directory.hpp).
#include "transport/site_directory.hpp"

#include <arpa/inet.h>
#include <fmt/format.h>

#include <cstring>

#include "transport/transport_error.hpp"

namespace geoloco::transport {

namespace {

void put32(std::vector<uint8_t>& out, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) out[at + static_cast<size_t>(i)] = static_cast<uint8_t>(v >> (8 * i));
}

uint32_t get32(std::span<const uint8_t> b, size_t at) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | b[at + static_cast<size_t>(i)];
  return v;
}

}  // namespace

std::vector<uint8_t> encode_site_directory(const std::vector<std::string>& addresses) {
  if (addresses.empty() || addresses.size() > kMaxDirectoryRanks)
    throw TransportError(fmt::format("site directory: {} addresses (1..{})", addresses.size(), kMaxDirectoryRanks));
  std::vector<uint8_t> out(kDirectoryHeaderBytes + 4 * addresses.size(), 0);
  put32(out, 0, kDirectoryMagic);
  out[4] = static_cast<uint8_t>(kDirectoryVersion);
  out[5] = static_cast<uint8_t>(kDirectoryVersion >> 8);
  put32(out, 8, static_cast<uint32_t>(addresses.size()));
  for (size_t r = 0; r < addresses.size(); ++r) {
    struct in_addr ip {};
    if (inet_pton(AF_INET, addresses[r].c_str(), &ip) != 1 || ip.s_addr == 0)
      throw TransportError(
          fmt::format("site directory: rank {}'s address '{}' is not an IPv4 address to dial", r, addresses[r]));
    std::memcpy(out.data() + kDirectoryHeaderBytes + 4 * r, &ip.s_addr, 4);
  }
  return out;
}

size_t site_directory_body_bytes(std::span<const uint8_t> header, uint32_t expected_ranks, const std::string& who) {
  if (header.size() < kDirectoryHeaderBytes)
    throw TransportError(fmt::format("site directory from {}: {} bytes, shorter than its {}-byte header", who,
                                     header.size(), kDirectoryHeaderBytes));
  if (get32(header, 0) != kDirectoryMagic)
    throw TransportError(fmt::format("site directory from {}: bad magic 0x{:08x}", who, get32(header, 0)));
  const uint16_t version = static_cast<uint16_t>(header[4] | (header[5] << 8));
  if (version != kDirectoryVersion)
    throw TransportError(
        fmt::format("site directory from {}: version {}, this build reads {}", who, version, kDirectoryVersion));
  if (header[6] != 0 || header[7] != 0)
    throw TransportError(fmt::format("site directory from {}: reserved bytes not zero", who));
  const uint32_t n = get32(header, 8);
  if (n != expected_ranks)
    throw TransportError(
        fmt::format("site directory from {}: {} ranks, the config gives that site {}", who, n, expected_ranks));
  if (n == 0 || n > kMaxDirectoryRanks)
    throw TransportError(fmt::format("site directory from {}: {} ranks (1..{})", who, n, kMaxDirectoryRanks));
  return 4 * static_cast<size_t>(n);
}

std::vector<std::string> decode_site_directory(std::span<const uint8_t> bytes, uint32_t expected_ranks,
                                               const std::string& who) {
  const size_t body = site_directory_body_bytes(bytes, expected_ranks, who);
  if (bytes.size() != kDirectoryHeaderBytes + body)
    throw TransportError(
        fmt::format("site directory from {}: {} bytes, expected {}", who, bytes.size(), kDirectoryHeaderBytes + body));
  std::vector<std::string> out;
  out.reserve(expected_ranks);
  for (uint32_t r = 0; r < expected_ranks; ++r) {
    struct in_addr ip {};
    std::memcpy(&ip.s_addr, bytes.data() + kDirectoryHeaderBytes + 4 * r, 4);
    char text[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, &ip, text, sizeof text);
    if (ip.s_addr == 0)
      throw TransportError(fmt::format("site directory from {}: rank {} has no address (0.0.0.0)", who, r));
    out.emplace_back(text);
  }
  return out;
}

}  // namespace geoloco::transport

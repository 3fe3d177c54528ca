// The site directory: where each rank of a site listens, as its rank 0 tells the other sites
// (docs/shapes.md, "A site across nodes"). A site whose ranks find their own addresses
// (`sites[].nodes` without `hosts`) publishes them within the site; rank 0's gate serves them
// to a peer that passed the gate's HMAC-PSK handshake on the directory lane, and the other
// sites dial each rank at its address (port: the site's port + rank, as always).
//
// Wire (after the handshake, on the gate's TCP connection), little-endian:
//   off size field
//     0    4 magic "GLDR"
//     4    2 version (1)
//     6    2 zero
//     8    4 rank count n (1..kMaxDirectoryRanks)
//    12   4n IPv4 address of rank r, network byte order
// A reader checks magic, version, that n is the rank count it expects and the exact length.
// The bytes are not MAC'd: whoever could alter them could also drop the connection, and a
// wrong address only makes the dial fail its own authenticated handshake.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace geoloco::transport {

inline constexpr uint32_t kDirectoryMagic = 0x52444C47;  // "GLDR"
inline constexpr uint16_t kDirectoryVersion = 1;
inline constexpr size_t kDirectoryHeaderBytes = 12;
inline constexpr uint32_t kMaxDirectoryRanks = 1u << 16;
// The transcript lane of a directory request at the gate (its MACs are valid nowhere else).
inline constexpr uint16_t kDirectoryLane = 0xFFFE;

// Throws TransportError when an address is not dotted IPv4 or there are none/too many.
std::vector<uint8_t> encode_site_directory(const std::vector<std::string>& addresses);
// The body length a header announces (the header checked, n against `expected_ranks`);
// throws TransportError naming `who` and what is wrong.
size_t site_directory_body_bytes(std::span<const uint8_t> header, uint32_t expected_ranks, const std::string& who);
// The whole message (header + body) back to dotted addresses; same checks.
std::vector<std::string> decode_site_directory(std::span<const uint8_t> bytes, uint32_t expected_ranks,
                                               const std::string& who);

}  // namespace geoloco::transport

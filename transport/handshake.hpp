// Handshake messages and the HMAC-SHA256 challenge-response (see README.md, "Handshake").
//
// Each lane (UCX endpoint) is authenticated on its own, dialer D -> listener L:
//   D->L HELLO     {version, run_id, config_hash, chunk_bytes, lanes, lane, site, rank, nonce_D}
//   L->D HELLO_ACK {same fields of L, nonce_L, mac_L = HMAC(psk, transcript("listener"))}
//   D->L AUTH      {mac_D = HMAC(psk, transcript("dialer"))}
//   L->D AUTH_OK   {port}   (the gate tells the UCX listener's port; 0 on UCX lanes)
// Either side may answer REJECT {reason} instead and close; the reason is logged on both
// sides. The transcript binds both nonces, both identities, run id, config hash and lane,
// so a MAC is useless on any other connection or in the other direction.
//
// Wire: magic 'GLHS' u32, version u16, type u16, then the type's fields (little-endian,
// strings u16-length-prefixed and bounded). The magic/version/type prefix is frozen across
// versions so a version mismatch is always reported as such.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace geoloco::transport {

inline constexpr uint32_t kHandshakeMagic = 0x53484C47;  // "GLHS"
inline constexpr uint16_t kProtocolVersion = 2;          // 2: eager window credits (frame version 2)
inline constexpr size_t kMaxHandshakeBytes = 1024;
inline constexpr size_t kMaxSiteBytes = 64;
inline constexpr size_t kMaxRunIdBytes = 128;
inline constexpr size_t kMaxReasonBytes = 256;
inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kMacBytes = 32;
// The transcript lane of the gate's handshake (so its MACs are not valid on any UCX lane).
inline constexpr uint16_t kGateLane = 0xFFFF;

using Nonce = std::array<uint8_t, kNonceBytes>;
using Mac = std::array<uint8_t, kMacBytes>;

// kBye: sent on every lane by a transport shutting down cleanly, so the peer reports
// "shut down" instead of a connection error.
enum class HsType : uint16_t { kHello = 1, kHelloAck = 2, kAuth = 3, kAuthOk = 4, kReject = 5, kBye = 6 };

struct HsMessage {
  uint16_t version = kProtocolVersion;
  HsType type = HsType::kHello;
  // kHello / kHelloAck
  std::string run_id;
  uint64_t config_hash = 0;
  uint64_t chunk_bytes = 0;
  uint16_t lanes = 0;
  uint16_t lane = 0;
  std::string site;
  int32_t rank = 0;
  Nonce nonce{};
  // kHelloAck / kAuth
  Mac mac{};
  // kReject
  std::string reason;
  // kAuthOk from the gate: the port of the UCX listener behind it
  uint32_t port = 0;

  std::vector<uint8_t> encode() const;
};

// Result of decoding: the message, or why it was refused. A message whose version differs
// from ours decodes only up to the version (error names both versions).
struct HsDecoded {
  std::optional<HsMessage> msg;
  std::string error;
  uint16_t version = 0;  // as received (0 when even the prefix was short)
};
HsDecoded decode_handshake(std::span<const uint8_t> in, uint16_t expected_version);

// Fresh random nonce from OpenSSL's CSPRNG (throws TransportError if it fails).
Nonce random_nonce();

// MAC over the canonical transcript. `role` is "dialer" or "listener".
struct HsTranscript {
  std::string run_id;
  uint64_t config_hash = 0;
  std::string dialer_site;
  int32_t dialer_rank = 0;
  std::string listener_site;
  int32_t listener_rank = 0;
  uint16_t lane = 0;
  Nonce dialer_nonce{};
  Nonce listener_nonce{};
};
Mac compute_mac(std::span<const uint8_t> psk, const HsTranscript& t, std::string_view role);
// Constant-time comparison.
bool mac_equal(const Mac& a, const Mac& b);

}  // namespace geoloco::transport

// Handshake messages (encode, bounds-checked decode), nonces, HMAC-SHA256 transcript MACs (handshake.hpp).
#include "transport/handshake.hpp"

#include <fmt/format.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "transport/transport_error.hpp"
#include "transport/wire.hpp"

namespace geoloco::transport {

std::vector<uint8_t> HsMessage::encode() const {
  wire::Writer w;
  w.u32(kHandshakeMagic);
  w.u16(version);
  w.u16(static_cast<uint16_t>(type));
  switch (type) {
    case HsType::kHello:
    case HsType::kHelloAck:
      w.str(run_id);
      w.u64(config_hash);
      w.u64(chunk_bytes);
      w.u16(lanes);
      w.u16(lane);
      w.str(site);
      w.u32(static_cast<uint32_t>(rank));
      w.bytes(nonce);
      if (type == HsType::kHelloAck) w.bytes(mac);
      break;
    case HsType::kAuth: w.bytes(mac); break;
    case HsType::kAuthOk: w.u32(port); break;
    case HsType::kBye: break;
    case HsType::kReject: w.str(reason.substr(0, kMaxReasonBytes)); break;
  }
  return w.take();
}

HsDecoded decode_handshake(std::span<const uint8_t> in, uint16_t expected_version) {
  HsDecoded out;
  if (in.size() > kMaxHandshakeBytes) {
    out.error = fmt::format("handshake message of {} bytes exceeds {}", in.size(), kMaxHandshakeBytes);
    return out;
  }
  wire::Reader r(in);
  uint32_t magic = 0;
  uint16_t version = 0, type = 0;
  if (!r.u32(magic) || !r.u16(version) || !r.u16(type)) {
    out.error = fmt::format("handshake message truncated ({} bytes)", in.size());
    return out;
  }
  if (magic != kHandshakeMagic) {
    out.error = fmt::format("bad handshake magic {:#010x}", magic);
    return out;
  }
  out.version = version;
  HsMessage m;
  m.version = version;
  m.type = static_cast<HsType>(type);
  // A reject is readable whatever the version, so the refused side learns why.
  if (m.type == HsType::kReject) {
    if (!r.str(m.reason, kMaxReasonBytes) || r.left() != 0) {
      out.error = "malformed reject message";
      return out;
    }
    out.msg = std::move(m);
    return out;
  }
  if (version != expected_version) {
    out.error = fmt::format("protocol version mismatch: peer speaks {}, we speak {}", version, expected_version);
    return out;
  }
  bool ok = true;
  switch (m.type) {
    case HsType::kHello:
    case HsType::kHelloAck: {
      uint32_t rank = 0;
      ok = r.str(m.run_id, kMaxRunIdBytes) && r.u64(m.config_hash) && r.u64(m.chunk_bytes) && r.u16(m.lanes) &&
           r.u16(m.lane) && r.str(m.site, kMaxSiteBytes) && r.u32(rank) && r.bytes(m.nonce);
      m.rank = static_cast<int32_t>(rank);
      if (ok && m.type == HsType::kHelloAck) ok = r.bytes(m.mac);
      break;
    }
    case HsType::kAuth: ok = r.bytes(m.mac); break;
    case HsType::kAuthOk: ok = r.u32(m.port); break;
    case HsType::kBye: break;
    default: out.error = fmt::format("unknown handshake message type {}", type); return out;
  }
  if (!ok || r.left() != 0) {
    out.error = fmt::format("malformed handshake message (type {}, {} bytes)", type, in.size());
    return out;
  }
  out.msg = std::move(m);
  return out;
}

Nonce random_nonce() {
  Nonce n{};
  if (RAND_bytes(n.data(), static_cast<int>(n.size())) != 1) throw TransportError("RAND_bytes failed");
  return n;
}

Mac compute_mac(std::span<const uint8_t> psk, const HsTranscript& t, std::string_view role) {
  wire::Writer w;
  w.str("geoloco-transport-handshake");
  w.u16(kProtocolVersion);
  w.str(role);
  w.str(t.run_id);
  w.u64(t.config_hash);
  w.str(t.dialer_site);
  w.u32(static_cast<uint32_t>(t.dialer_rank));
  w.str(t.listener_site);
  w.u32(static_cast<uint32_t>(t.listener_rank));
  w.u16(t.lane);
  w.bytes(t.dialer_nonce);
  w.bytes(t.listener_nonce);
  Mac mac{};
  unsigned int len = 0;
  const auto& msg = w.buffer();
  if (HMAC(EVP_sha256(), psk.data(), static_cast<int>(psk.size()), msg.data(), msg.size(), mac.data(), &len) ==
          nullptr ||
      len != kMacBytes)
    throw TransportError("HMAC-SHA256 failed");
  return mac;
}

bool mac_equal(const Mac& a, const Mac& b) { return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0; }

}  // namespace geoloco::transport

// Wire format of the rendezvous key-value store (TcpStore). Little-endian, one request ->
// one reply on a TCP connection.
//
//   header (16 bytes): magic u32 "GLTS" | version u16 | type u16 | payload_len u32 | reserved u32 (0)
//   string / bytes:    len u32 | len bytes
//
//   SET      key, value            -> OK
//   GET      key                   -> VALUE  found u8 | value   (found=0: value empty)
//   CHECK    count u32, count keys -> PRESENCE count u32 | count x u8 (1 = key present)
//   ADD      key, delta i64        -> COUNTER i64 (new value; atomic; used for arrival counts)
//   any malformed request          -> ERROR message, then the server closes the connection
//
// Limits are enforced before any allocation: key <= kMaxKeyBytes, value <= kMaxValueBytes,
// payload <= kMaxPayloadBytes, keys per CHECK <= kMaxCheckKeys. A header with a wrong magic,
// version or reserved field closes the connection without a reply (it is not our protocol).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace geoloco::parallel::store_wire {

inline constexpr uint32_t kMagic = 0x53544C47;  // "GLTS" read as little-endian bytes
inline constexpr uint16_t kVersion = 1;
inline constexpr size_t kHeaderBytes = 16;
inline constexpr size_t kMaxKeyBytes = 4096;
inline constexpr size_t kMaxValueBytes = size_t{16} << 20;
inline constexpr size_t kMaxCheckKeys = 65536;
inline constexpr size_t kMaxPayloadBytes = kMaxValueBytes + kMaxKeyBytes + 64;

enum class Type : uint16_t {
  kSet = 1,
  kGet = 2,
  kCheck = 3,
  kAdd = 4,
  kOk = 0x81,
  kValue = 0x82,
  kPresence = 0x83,
  kCounter = 0x84,
  kError = 0x8F,
};

struct Header {
  Type type{};
  uint32_t payload_len = 0;
};

std::array<uint8_t, kHeaderBytes> encode_header(Type type, uint32_t payload_len);
// "" when the header is ours and within limits; otherwise why not.
std::string decode_header(std::span<const uint8_t, kHeaderBytes> bytes, Header* out);

// A parsed request or reply; only the fields of its type are set.
struct Message {
  Type type{};
  std::string key;                // SET, GET, ADD
  std::vector<char> value;        // SET, VALUE
  bool found = false;             // VALUE
  std::vector<std::string> keys;  // CHECK
  std::vector<uint8_t> present;   // PRESENCE
  int64_t counter = 0;            // ADD (delta), COUNTER (new value)
  std::string error;              // ERROR
};

// Whole frame (header + payload). Throws geoloco::Error when a limit is exceeded.
std::vector<uint8_t> encode(const Message& m);
// Parses a payload of the given type; throws StoreError with a reason when it is
// malformed (truncated, trailing bytes, over a limit, unknown type).
Message decode(Type type, std::span<const uint8_t> payload);

}  // namespace geoloco::parallel::store_wire

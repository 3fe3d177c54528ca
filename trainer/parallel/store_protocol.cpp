#include "trainer/parallel/store_protocol.hpp"

#include <algorithm>
#include <cstring>

#include "trainer/parallel/errors.hpp"

namespace geoloco::parallel::store_wire {
namespace {

void put_u16(std::vector<uint8_t>& b, uint16_t v) {
  b.push_back(static_cast<uint8_t>(v));
  b.push_back(static_cast<uint8_t>(v >> 8));
}
void put_u32(std::vector<uint8_t>& b, uint32_t v) {
  for (int i = 0; i < 4; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void put_u64(std::vector<uint8_t>& b, uint64_t v) {
  for (int i = 0; i < 8; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void put_bytes(std::vector<uint8_t>& b, const void* p, size_t n) {
  put_u32(b, static_cast<uint32_t>(n));
  const auto* c = static_cast<const uint8_t*>(p);
  b.insert(b.end(), c, c + n);
}

uint32_t get_u32_at(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}

// Bounds-checked cursor over a payload.
class Reader {
 public:
  explicit Reader(std::span<const uint8_t> s) : s_(s) {}
  void need(size_t n, const char* what) {
    if (s_.size() - pos_ < n)
      throw StoreError(fmt::format("store message truncated reading {} (need {} bytes, {} left)", what, n,
                                   s_.size() - pos_));
  }
  uint8_t u8(const char* what) {
    need(1, what);
    return s_[pos_++];
  }
  uint32_t u32(const char* what) {
    need(4, what);
    uint32_t v = get_u32_at(s_.data() + pos_);
    pos_ += 4;
    return v;
  }
  uint64_t u64(const char* what) {
    need(8, what);
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= uint64_t{s_[pos_ + i]} << (8 * i);
    pos_ += 8;
    return v;
  }
  std::span<const uint8_t> bytes(size_t limit, const char* what) {
    uint32_t n = u32(what);
    if (n > limit) throw StoreError(fmt::format("store message: {} of {} bytes exceeds the limit {}", what, n, limit));
    need(n, what);
    auto out = s_.subspan(pos_, n);
    pos_ += n;
    return out;
  }
  std::string str(size_t limit, const char* what) {
    auto b = bytes(limit, what);
    return std::string(b.begin(), b.end());
  }
  void done() {
    if (pos_ != s_.size())
      throw StoreError(fmt::format("store message has {} trailing bytes", s_.size() - pos_));
  }

 private:
  std::span<const uint8_t> s_;
  size_t pos_ = 0;
};

void check_key(const std::string& k) {
  if (k.size() > kMaxKeyBytes)
    throw StoreError(fmt::format("store key of {} bytes exceeds the limit {}", k.size(), kMaxKeyBytes));
}

}  // namespace

std::array<uint8_t, kHeaderBytes> encode_header(Type type, uint32_t payload_len) {
  std::vector<uint8_t> b;
  put_u32(b, kMagic);
  put_u16(b, kVersion);
  put_u16(b, static_cast<uint16_t>(type));
  put_u32(b, payload_len);
  put_u32(b, 0);
  std::array<uint8_t, kHeaderBytes> out{};
  std::memcpy(out.data(), b.data(), kHeaderBytes);
  return out;
}

std::string decode_header(std::span<const uint8_t, kHeaderBytes> b, Header* out) {
  const uint32_t magic = get_u32_at(b.data());
  if (magic != kMagic) return fmt::format("bad magic 0x{:08x}", magic);
  const uint16_t version = static_cast<uint16_t>(b[4] | b[5] << 8);
  if (version != kVersion) return fmt::format("unsupported version {} (this build speaks {})", version, kVersion);
  const uint16_t type = static_cast<uint16_t>(b[6] | b[7] << 8);
  const uint32_t len = get_u32_at(b.data() + 8);
  const uint32_t reserved = get_u32_at(b.data() + 12);
  if (reserved != 0) return fmt::format("reserved field is 0x{:08x}, not 0", reserved);
  if (len > kMaxPayloadBytes) return fmt::format("payload of {} bytes exceeds the limit {}", len, kMaxPayloadBytes);
  out->type = static_cast<Type>(type);
  out->payload_len = len;
  return "";
}

std::vector<uint8_t> encode(const Message& m) {
  std::vector<uint8_t> p;
  switch (m.type) {
    case Type::kSet:
      check_key(m.key);
      if (m.value.size() > kMaxValueBytes)
        throw StoreError(fmt::format("store value for key '{}' of {} bytes exceeds the limit {}", m.key,
                                     m.value.size(), kMaxValueBytes));
      put_bytes(p, m.key.data(), m.key.size());
      put_bytes(p, m.value.data(), m.value.size());
      break;
    case Type::kGet:
      check_key(m.key);
      put_bytes(p, m.key.data(), m.key.size());
      break;
    case Type::kAdd:
      check_key(m.key);
      put_bytes(p, m.key.data(), m.key.size());
      put_u64(p, static_cast<uint64_t>(m.counter));
      break;
    case Type::kCheck:
      if (m.keys.size() > kMaxCheckKeys)
        throw StoreError(fmt::format("store CHECK of {} keys exceeds the limit {}", m.keys.size(), kMaxCheckKeys));
      put_u32(p, static_cast<uint32_t>(m.keys.size()));
      for (const auto& k : m.keys) {
        check_key(k);
        put_bytes(p, k.data(), k.size());
      }
      break;
    case Type::kOk:
      break;
    case Type::kValue:
      p.push_back(m.found ? 1 : 0);
      put_bytes(p, m.value.data(), m.value.size());
      break;
    case Type::kPresence:
      put_u32(p, static_cast<uint32_t>(m.present.size()));
      p.insert(p.end(), m.present.begin(), m.present.end());
      break;
    case Type::kCounter:
      put_u64(p, static_cast<uint64_t>(m.counter));
      break;
    case Type::kError:
      put_bytes(p, m.error.data(), std::min(m.error.size(), kMaxKeyBytes));
      break;
  }
  if (p.size() > kMaxPayloadBytes)
    throw StoreError(fmt::format("store message of {} bytes exceeds the limit {}", p.size(), kMaxPayloadBytes));
  auto h = encode_header(m.type, static_cast<uint32_t>(p.size()));
  std::vector<uint8_t> out(kHeaderBytes + p.size());
  std::memcpy(out.data(), h.data(), kHeaderBytes);
  if (!p.empty()) std::memcpy(out.data() + kHeaderBytes, p.data(), p.size());
  return out;
}

Message decode(Type type, std::span<const uint8_t> payload) {
  Reader r(payload);
  Message m;
  m.type = type;
  switch (type) {
    case Type::kSet: {
      m.key = r.str(kMaxKeyBytes, "key");
      auto v = r.bytes(kMaxValueBytes, "value");
      m.value.assign(v.begin(), v.end());
      break;
    }
    case Type::kGet:
      m.key = r.str(kMaxKeyBytes, "key");
      break;
    case Type::kAdd:
      m.key = r.str(kMaxKeyBytes, "key");
      m.counter = static_cast<int64_t>(r.u64("delta"));
      break;
    case Type::kCheck: {
      uint32_t n = r.u32("key count");
      if (n > kMaxCheckKeys)
        throw StoreError(fmt::format("store CHECK of {} keys exceeds the limit {}", n, kMaxCheckKeys));
      m.keys.reserve(n);
      for (uint32_t i = 0; i < n; ++i) m.keys.push_back(r.str(kMaxKeyBytes, "key"));
      break;
    }
    case Type::kOk:
      break;
    case Type::kValue: {
      uint8_t f = r.u8("found flag");
      if (f > 1) throw StoreError(fmt::format("store VALUE has found flag {}", f));
      m.found = f == 1;
      auto v = r.bytes(kMaxValueBytes, "value");
      m.value.assign(v.begin(), v.end());
      break;
    }
    case Type::kPresence: {
      uint32_t n = r.u32("key count");
      if (n > kMaxCheckKeys)
        throw StoreError(fmt::format("store PRESENCE of {} keys exceeds the limit {}", n, kMaxCheckKeys));
      r.need(n, "presence flags");
      m.present.resize(n);
      for (uint32_t i = 0; i < n; ++i) m.present[i] = r.u8("presence flag");
      break;
    }
    case Type::kCounter:
      m.counter = static_cast<int64_t>(r.u64("counter"));
      break;
    case Type::kError:
      m.error = r.str(kMaxKeyBytes, "error text");
      break;
    default:
      throw StoreError(fmt::format("unknown store message type 0x{:04x}", static_cast<unsigned>(type)));
  }
  r.done();
  return m;
}

}  // namespace geoloco::parallel::store_wire

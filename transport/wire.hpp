// Little-endian, bounds-checked byte encoding for everything geoloco::transport puts on the
// wire. Readers never trust a length before checking it against what is left.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace geoloco::transport::wire {

class Writer {
 public:
  void u8(uint8_t v) { put(v, 1); }
  void u16(uint16_t v) { put(v, 2); }
  void u32(uint32_t v) { put(v, 4); }
  void u64(uint64_t v) { put(v, 8); }
  void bytes(std::span<const uint8_t> b) { buf_.insert(buf_.end(), b.begin(), b.end()); }
  // u16 length prefix then the bytes.
  void str(std::string_view s) {
    u16(static_cast<uint16_t>(s.size()));
    size_t at = buf_.size();
    buf_.resize(at + s.size());
    if (!s.empty()) std::memcpy(buf_.data() + at, s.data(), s.size());
  }
  std::vector<uint8_t>& buffer() { return buf_; }
  std::vector<uint8_t> take() { return std::move(buf_); }

 private:
  void put(uint64_t v, int n) {
    size_t at = buf_.size();
    buf_.resize(at + n);
    for (int i = 0; i < n; ++i) buf_[at + i] = static_cast<uint8_t>(v >> (8 * i));
  }
  std::vector<uint8_t> buf_;
};

// Every read returns false (and leaves the output untouched) when the input is too short.
class Reader {
 public:
  explicit Reader(std::span<const uint8_t> in) : in_(in) {}
  bool u8(uint8_t& v) { return get(v, 1); }
  bool u16(uint16_t& v) { return get(v, 2); }
  bool u32(uint32_t& v) { return get(v, 4); }
  bool u64(uint64_t& v) { return get(v, 8); }
  bool bytes(std::span<uint8_t> out) {
    if (left() < out.size()) return false;
    std::memcpy(out.data(), in_.data() + pos_, out.size());
    pos_ += out.size();
    return true;
  }
  // A u16-prefixed string of at most max_len bytes.
  bool str(std::string& s, size_t max_len) {
    uint16_t n = 0;
    size_t save = pos_;
    if (!u16(n) || n > max_len || left() < n) {
      pos_ = save;
      return false;
    }
    s.assign(reinterpret_cast<const char*>(in_.data() + pos_), n);
    pos_ += n;
    return true;
  }
  size_t left() const { return in_.size() - pos_; }

 private:
  template <class T>
  bool get(T& v, int n) {
    if (left() < static_cast<size_t>(n)) return false;
    uint64_t x = 0;
    for (int i = 0; i < n; ++i) x |= static_cast<uint64_t>(in_[pos_ + i]) << (8 * i);
    v = static_cast<T>(x);
    pos_ += n;
    return true;
  }
  std::span<const uint8_t> in_;
  size_t pos_ = 0;
};

}  // namespace geoloco::transport::wire

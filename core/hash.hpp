// Hashing used for frame checksums, config hashes and global-weight fingerprints (XXH3).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace geoloco {

uint64_t hash64(const void* data, size_t bytes, uint64_t seed = 0);
inline uint64_t hash64(std::string_view s, uint64_t seed = 0) { return hash64(s.data(), s.size(), seed); }
inline uint64_t hash64(std::span<const float> v, uint64_t seed = 0) { return hash64(v.data(), v.size_bytes(), seed); }
// 16 lowercase hex digits.
std::string hex64(uint64_t h);

// Incremental hashing over several spans.
class Hasher {
 public:
  explicit Hasher(uint64_t seed = 0);
  ~Hasher();
  Hasher(const Hasher&) = delete;
  Hasher& operator=(const Hasher&) = delete;
  void update(const void* data, size_t bytes);
  uint64_t digest() const;

 private:
  void* state_;
};

}  // namespace geoloco

// Little-endian loads and stores at any alignment (frames are byte streams; sections start
// at arbitrary offsets). The frame format is little-endian and so are the hosts we target;
// the static_assert makes a big-endian port fail loudly instead of mis-decoding.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>

namespace geoloco::compression::bytes {

static_assert(std::endian::native == std::endian::little, "frame codecs assume a little-endian host");

template <class T>
inline T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}
template <class T>
inline void store(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}

}  // namespace geoloco::compression::bytes

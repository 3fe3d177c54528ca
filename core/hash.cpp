#include "core/hash.hpp"

#include <fmt/format.h>
#include <xxhash.h>

#include <new>

namespace geoloco {

uint64_t hash64(const void* data, size_t bytes, uint64_t seed) { return XXH3_64bits_withSeed(data, bytes, seed); }

std::string hex64(uint64_t h) { return fmt::format("{:016x}", h); }

Hasher::Hasher(uint64_t seed) : state_(XXH3_createState()) {
  if (!state_) throw std::bad_alloc();
  XXH3_64bits_reset_withSeed(static_cast<XXH3_state_t*>(state_), seed);
}
Hasher::~Hasher() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }
void Hasher::update(const void* data, size_t bytes) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), data, bytes);
}
uint64_t Hasher::digest() const { return XXH3_64bits_digest(static_cast<XXH3_state_t*>(state_)); }

}  // namespace geoloco

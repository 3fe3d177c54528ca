// Deterministic, platform-independent random numbers (std:: distributions are not
// bit-reproducible across standard libraries). Same seed -> same bits everywhere.
#pragma once

#include <cmath>
#include <cstdint>

namespace geoloco {

// splitmix64: a stateless mixer, used to derive independent streams from (seed, index...).
constexpr uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
constexpr uint64_t mix_seed(uint64_t a, uint64_t b) { return splitmix64(a ^ splitmix64(b)); }

// xoshiro256** generator.
class Rng {
 public:
  explicit Rng(uint64_t seed) {
    uint64_t x = seed;
    for (auto& s : s_) {
      x = splitmix64(x);
      s = x;
    }
  }
  uint64_t next_u64() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }
  // Uniform integer in [0, n), n > 0 (Lemire's method without bias rejection is fine here:
  // 64-bit draws make the bias < n / 2^64).
  uint64_t below(uint64_t n) { return static_cast<uint64_t>((static_cast<unsigned __int128>(next_u64()) * n) >> 64); }
  // Standard normal via Box-Muller (uses two uniforms per call; no cached spare, so the
  // stream position depends only on the number of calls).
  double normal() {
    double u1 = uniform();
    double u2 = uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

}  // namespace geoloco

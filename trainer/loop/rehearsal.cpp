// The rehearsal's stand-in inner step: a seeded drift of the shard (rehearsal.hpp).
#include "trainer/loop/rehearsal.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "compression/synthetic.hpp"
#include "core/rng.hpp"

namespace geoloco::trainer {

namespace {
constexpr uint32_t kValueBits = 16;  // 2^16 Student-t values (256 KiB: stays in cache)
constexpr uint32_t kScaleBits = 12;  // 2^12 log-normal row scales
constexpr uint32_t kRowBits = 10;    // a row: 1024 consecutive elements share a scale

// murmur3's 32-bit finalizer: vectorizes (32-bit multiplies), and scatters consecutive
// elements over the table so the direction has no period a compressor could find.
inline uint32_t fmix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  return h ^ (h >> 16);
}
}  // namespace

RehearsalConfig RehearsalConfig::from_yaml(const config::Node& n) {
  RehearsalConfig c;
  c.enabled = true;
  c.step_seconds = n.get_double("step_seconds", c.step_seconds, 1e-4, 3600.0);
  c.drift = n.get_double("drift", c.drift, 0.0, 1.0);
  n.finish();
  return c;
}

Rehearsal::Rehearsal(const RehearsalConfig& cfg, uint64_t seed) : cfg_(cfg), seed_(seed) {
  // Student-t (nu 3) values with one scale (row = the whole table), normalized to unit mean
  // magnitude; the per-row log-normal scales come from their own table (E exp(N(0, 1)) = 1.65).
  values_ =
      compression::synthetic_pseudo_gradient(size_t{1} << kValueBits, splitmix64(seed), size_t{1} << kValueBits, 1.0);
  double mean_abs = 0;
  for (float v : values_) mean_abs += std::fabs(v);
  mean_abs /= double(values_.size());
  for (auto& v : values_) v = static_cast<float>(v / mean_abs);
  Rng rng(splitmix64(seed + 1));
  scales_.resize(size_t{1} << kScaleBits);
  for (auto& s : scales_) s = static_cast<float>(std::exp(rng.normal()));
}

double Rehearsal::drift(std::span<float> shard, int64_t offset, int64_t step, int64_t interval) {
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t h = std::max<int64_t>(interval, 1);
  // The whole period's move at its first step: one pass over the shard per period, so the
  // stand-in leaves the host's cores to the outer loop as a GPU's inner loop would.
  const int64_t this_period = (step - 1) / h;
  const bool due = (step - 1) % h == 0 || pending_period_ == this_period;
  pending_period_ = -1;
  if (!due) return 0.0;
  const uint64_t period = static_cast<uint64_t>(this_period);
  // Element i's direction in this period: a value drawn by hashing (i, period), times its
  // row's scale; i is absolute, so an element moves alike whatever the site's sharding.
  const uint64_t key = mix_seed(seed_, period);
  const uint32_t salt = static_cast<uint32_t>(key), row_shift = static_cast<uint32_t>(key >> 32);
  const float s = static_cast<float>(cfg_.drift * static_cast<double>(h));
  const float* vals = values_.data();
  const float* rows = scales_.data();
  const uint32_t vmask = (1u << kValueBits) - 1, smask = (1u << kScaleBits) - 1;
  float* p = shard.data();
  const int64_t n = static_cast<int64_t>(shard.size());
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t e = static_cast<uint64_t>(offset + i);
    const uint32_t pick = fmix32(static_cast<uint32_t>(e) ^ static_cast<uint32_t>(e >> 32) * 0x9e3779b9u ^ salt);
    const uint32_t row = (static_cast<uint32_t>(e >> kRowBits) + row_shift) & smask;
    p[i] -= s * rows[row] * vals[pick & vmask];
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void Rehearsal::skipped(int64_t step, int64_t interval) {
  const int64_t h = std::max<int64_t>(interval, 1);
  if ((step - 1) % h == 0) pending_period_ = (step - 1) / h;
}

void Rehearsal::count_step(double drift_s, double step_s) {
  ++steps_;
  drift_seconds_ += drift_s;
  if (drift_s > step_s) ++overruns_;
}

nlohmann::json Rehearsal::to_json() const {
  return {{"step_seconds", cfg_.step_seconds},
          {"drift", cfg_.drift},
          {"steps", steps_},
          {"overrun_steps", overruns_},
          {"drift_seconds_mean", steps_ ? drift_seconds_ / double(steps_) : 0.0}};
}

}  // namespace geoloco::trainer

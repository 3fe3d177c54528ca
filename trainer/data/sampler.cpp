#include "trainer/data/sampler.hpp"

#include <bit>
#include <cstring>
#include <numeric>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/rng.hpp"

namespace geoloco::trainer {

static_assert(std::endian::native == std::endian::little, "sampler state blob is little-endian");

namespace {

constexpr uint32_t kStateMagic = 0x53534c47;  // "GLSS" read as little-endian bytes
constexpr uint32_t kStateVersion = 2;
constexpr size_t kStateBytesV1 = 4 + 4 + 8 * 4 + 4 + 4;
constexpr size_t kStateBytes = kStateBytesV1 + 4;

template <class T>
void put(std::vector<uint8_t>& out, T v) {
  const size_t at = out.size();
  out.resize(at + sizeof v);
  std::memcpy(out.data() + at, &v, sizeof v);
}

template <class T>
T get(std::span<const uint8_t> in, size_t& at) {
  T v;
  std::memcpy(&v, in.data() + at, sizeof v);
  at += sizeof v;
  return v;
}

}  // namespace

std::vector<uint8_t> SamplerState::to_bytes() const {
  std::vector<uint8_t> out;
  out.reserve(kStateBytes);
  put(out, kStateMagic);
  put(out, kStateVersion);
  put(out, epoch);
  put(out, position);
  put(out, seed);
  put(out, num_windows);
  put(out, world);
  put(out, seq_len);
  put(out, random_offsets);
  return out;
}

SamplerState SamplerState::from_bytes(std::span<const uint8_t> bytes, const std::string& source) {
  if (bytes.size() < 8)
    throw FileError(source, fmt::format("sampler state is {} bytes, expected {}", bytes.size(), kStateBytes));
  size_t at = 0;
  const auto magic = get<uint32_t>(bytes, at);
  if (magic != kStateMagic) throw FileError(source, fmt::format("sampler state has bad magic {:#010x}", magic));
  const auto version = get<uint32_t>(bytes, at);
  if (version != 1 && version != kStateVersion)
    throw FileError(
        source, fmt::format("sampler state version {} is not supported (expected 1 or {})", version, kStateVersion));
  const size_t want = version == 1 ? kStateBytesV1 : kStateBytes;
  if (bytes.size() != want)
    throw FileError(source,
                    fmt::format("sampler state version {} is {} bytes, expected {}", version, bytes.size(), want));
  SamplerState s;
  s.epoch = get<uint64_t>(bytes, at);
  s.position = get<uint64_t>(bytes, at);
  s.seed = get<uint64_t>(bytes, at);
  s.num_windows = get<uint64_t>(bytes, at);
  s.world = get<int32_t>(bytes, at);
  s.seq_len = get<int32_t>(bytes, at);
  s.random_offsets = version == 1 ? 0 : get<uint32_t>(bytes, at);
  if (s.random_offsets > 1)
    throw FileError(source, fmt::format("sampler state: random_offsets {} (expected 0 or 1)", s.random_offsets));
  return s;
}

DistributedSampler::DistributedSampler(std::shared_ptr<const TokenDataset> dataset, SamplerOptions options)
    : dataset_(std::move(dataset)), opt_(options) {
  GEOLOCO_CHECK(dataset_ != nullptr, "null dataset");
  GEOLOCO_CHECK(opt_.world >= 1 && opt_.rank >= 0 && opt_.rank < opt_.world, "rank {} outside world {}", opt_.rank,
                opt_.world);
  GEOLOCO_CHECK(opt_.seq_len >= 1, "seq_len {} must be >= 1", opt_.seq_len);
  n_ = dataset_->num_windows(opt_.seq_len);
  if (opt_.random_offsets) {
    // The last aligned window has no room to shift: every sampled window has.
    if (!dataset_->shiftable())
      throw InputError(
          fmt::format("data.windows: random needs windows cut from a token stream (text or shards); "
                      "{} is not one",
                      dataset_->describe()));
    n_ = n_ > 0 ? n_ - 1 : 0;
  }
  if (n_ > UINT32_MAX)
    throw InputError(fmt::format("{}: {} windows of {} tokens exceed the sampler's limit of 2^32-1",
                                 dataset_->describe(), n_, opt_.seq_len + 1));
  row_.resize(static_cast<size_t>(opt_.seq_len) + 1);
}

size_t DistributedSampler::steps_per_epoch(int micro_batch) const {
  GEOLOCO_CHECK(micro_batch >= 1, "micro_batch {} must be >= 1", micro_batch);
  return samples_per_rank() / static_cast<size_t>(micro_batch);
}

std::vector<uint32_t> DistributedSampler::permutation(uint64_t epoch) const {
  std::vector<uint32_t> p(n_);
  std::iota(p.begin(), p.end(), 0u);
  if (!opt_.shuffle || n_ < 2) return p;
  Rng rng(mix_seed(mix_seed(opt_.seed, 0x73616d706c6572ULL /* "sampler" */), epoch));
  for (size_t i = n_ - 1; i > 0; --i) {
    const size_t j = static_cast<size_t>(rng.below(i + 1));
    std::swap(p[i], p[j]);
  }
  return p;
}

void DistributedSampler::build_epoch(uint64_t epoch) {
  if (built_epoch_ == epoch) return;
  // Keep only this rank's slice: 1/W of the memory of the full permutation between epochs.
  const auto p = permutation(epoch);
  const size_t per = samples_per_rank(), W = static_cast<size_t>(opt_.world), g = static_cast<size_t>(opt_.rank);
  mine_.resize(per);
  for (size_t i = 0; i < per; ++i) mine_[i] = p[g + i * W];
  built_epoch_ = epoch;
}

size_t DistributedSampler::window_at(uint64_t epoch, uint64_t global_position) const {
  GEOLOCO_CHECK(global_position < n_, "position {} outside {} windows", global_position, n_);
  return permutation(epoch)[static_cast<size_t>(global_position)];
}

int DistributedSampler::shift_of(uint64_t epoch, size_t window) const {
  if (!opt_.random_offsets) return 0;
  const uint64_t h = mix_seed(mix_seed(mix_seed(opt_.seed, 0x6f666673657473ULL /* "offsets" */), epoch), window);
  return static_cast<int>(h % static_cast<uint64_t>(opt_.seq_len));
}

std::vector<size_t> DistributedSampler::next_indices(int micro_batch) {
  const size_t B = static_cast<size_t>(micro_batch);
  if (steps_per_epoch(micro_batch) == 0)
    throw InputError(fmt::format(
        "{} has {} windows of {} tokens: fewer than one global batch of world {} x micro_batch {} = {}",
        dataset_->describe(), n_, opt_.seq_len + 1, opt_.world, micro_batch, static_cast<size_t>(opt_.world) * B));
  if (position_ + B > samples_per_rank()) {
    ++epoch_;
    position_ = 0;
  }
  build_epoch(epoch_);
  std::vector<size_t> out(B);
  for (size_t r = 0; r < B; ++r) out[r] = mine_[static_cast<size_t>(position_) + r];
  position_ += B;
  return out;
}

void DistributedSampler::next_batch(int micro_batch, int T, int32_t* inputs, int32_t* targets) {
  GEOLOCO_CHECK(T == opt_.seq_len, "next_batch T={} but the sampler was built for seq_len {}", T, opt_.seq_len);
  const auto idx = next_indices(micro_batch);
  const size_t t = static_cast<size_t>(T);
  for (size_t b = 0; b < idx.size(); ++b) {
    if (opt_.random_offsets)
      dataset_->window_shifted(idx[b], T, shift_of(epoch_, idx[b]), row_.data());
    else
      dataset_->window(idx[b], T, row_.data());
    std::memcpy(inputs + b * t, row_.data(), t * sizeof(int32_t));
    std::memcpy(targets + b * t, row_.data() + 1, t * sizeof(int32_t));
  }
}

SamplerState DistributedSampler::state() const {
  SamplerState s;
  s.epoch = epoch_;
  s.position = position_;
  s.seed = opt_.seed;
  s.num_windows = n_;
  s.world = opt_.world;
  s.seq_len = opt_.seq_len;
  s.random_offsets = opt_.random_offsets ? 1 : 0;
  return s;
}

void DistributedSampler::restore(const SamplerState& s) {
  auto mismatch = [&](const char* what, auto saved, auto now) {
    throw InputError(fmt::format("cannot resume the data sampler: saved {} {} differs from this run's {} ({})", what,
                                 saved, now, dataset_->describe()));
  };
  if (s.seed != opt_.seed) mismatch("seed", s.seed, opt_.seed);
  if (s.world != opt_.world) mismatch("world size", s.world, opt_.world);
  if (s.seq_len != opt_.seq_len) mismatch("seq_len", s.seq_len, opt_.seq_len);
  if ((s.random_offsets != 0) != opt_.random_offsets)
    throw InputError(fmt::format("cannot resume the data sampler: it was saved with data.windows: {}, this run has {}",
                                 s.random_offsets ? "random" : "aligned", opt_.random_offsets ? "random" : "aligned"));
  if (s.num_windows != n_) mismatch("window count", s.num_windows, n_);
  if (s.position > samples_per_rank())
    throw InputError(fmt::format("cannot resume the data sampler: position {} is past the {} samples of an epoch",
                                 s.position, samples_per_rank()));
  epoch_ = s.epoch;
  position_ = s.position;
}

}  // namespace geoloco::trainer

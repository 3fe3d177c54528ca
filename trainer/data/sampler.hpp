// DistributedSampler: which windows each rank trains on, across the WHOLE run.
//
// Contract (PyTorch DistributedSampler semantics, extended to batches and resumes):
//   * world W = every rank of every site; this sampler is global rank g in [0, W).
//   * N = dataset.num_windows(T). Epoch e uses a permutation perm_e of [0, N): Fisher-Yates
//     driven by geoloco::Rng seeded from (seed, e) (the identity when shuffle is off).
//     Every rank computes the same perm_e; epochs reshuffle.
//   * Rank g's i-th sample of epoch e is window perm_e[g + i*W]  (positions g, g+W, g+2W...).
//   * Batches: the k-th call of next_batch(B) in an epoch returns rank g's samples
//     [k*B, (k+1)*B), i.e. global positions g + W*(k*B + r) for rows r in [0, B).
//     An epoch has floor(N / (W*B)) batches; when the next batch would run past
//     floor(N / W) samples the tail is dropped and epoch e+1 starts. All ranks therefore
//     draw the same number of batches per epoch and move to a new epoch together.
//   * Union property: at step k the W ranks together draw exactly the global positions
//     [k*W*B, (k+1)*W*B) -- the same windows a single rank (W=1) with batch W*B draws at
//     step k (its row g + W*r is rank g's row r). So "DDP on W ranks" and "one rank with W
//     times the batch" see the same data at every step, and the mean loss/gradient agree
//     up to summation order.
//   * Rows are windows of T+1 tokens: inputs[b*T + t] = w[t], targets[b*T + t] = w[t+1].
//   * State = (epoch, position = samples this rank consumed in the epoch). It is the same on
//     every rank at a given step, so one saved state restores every rank; restoring it
//     continues bit-for-bit.
//   * Limit: N < 2^32 windows (the permutation is stored as uint32).
//   * Random offsets (random_offsets, data.windows: random): N = dataset.num_windows(T) - 1,
//     and sample window perm_e[p] starts shift(e, perm_e[p]) in [0, T) tokens after its
//     aligned start, shift a hash of (seed, e, window): every rank computes the same shifts,
//     so everything above (disjoint positions, the union property, resumes) holds unchanged.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "trainer/data/token_dataset.hpp"

namespace geoloco::trainer {

struct SamplerOptions {
  uint64_t seed = 0;
  int world = 1;    // all ranks of all sites
  int rank = 0;     // global rank in [0, world)
  int seq_len = 0;  // T: windows are T+1 tokens
  bool shuffle = true;
  bool random_offsets = false;  // windows start at a seeded offset in [0, T) (above)
};

// Resumable position. The identity fields (seed, world, seq_len, num_windows) are checked on
// restore: resuming with a different world size, sequence length or dataset would silently
// change the data order, so it is refused.
struct SamplerState {
  uint64_t epoch = 0;
  uint64_t position = 0;
  uint64_t seed = 0;
  uint64_t num_windows = 0;
  int32_t world = 1;
  int32_t seq_len = 0;
  uint32_t random_offsets = 0;  // 1: data.windows random

  // Versioned little-endian blob: magic "GLSS", version 2, then the fields above (52 bytes);
  // version 1 (48 bytes, before random_offsets) reads as aligned windows.
  std::vector<uint8_t> to_bytes() const;
  // Throws FileError(source, problem) for a wrong size, magic or version.
  static SamplerState from_bytes(std::span<const uint8_t> bytes, const std::string& source);
  bool operator==(const SamplerState&) const = default;
};

class DistributedSampler {
 public:
  // Throws InputError when the dataset has fewer windows than one global batch would need
  // (checked per call, since the batch size is a next_batch argument) or more than 2^32-1.
  DistributedSampler(std::shared_ptr<const TokenDataset> dataset, SamplerOptions options);

  // Fills B rows of T inputs and T targets (T must equal options.seq_len).
  void next_batch(int micro_batch, int T, int32_t* inputs, int32_t* targets);
  // The window indices next_batch would read (advances the state the same way).
  std::vector<size_t> next_indices(int micro_batch);

  size_t num_windows() const { return n_; }
  size_t samples_per_rank() const { return n_ / static_cast<size_t>(opt_.world); }
  size_t steps_per_epoch(int micro_batch) const;
  uint64_t epoch() const { return epoch_; }
  uint64_t position() const { return position_; }
  const SamplerOptions& options() const { return opt_; }

  SamplerState state() const;
  // Throws InputError if the state belongs to a different seed/world/seq_len/dataset or its
  // position is past the end of an epoch.
  void restore(const SamplerState& state);

  // perm_e[global_position] (for tests and diagnostics).
  size_t window_at(uint64_t epoch, uint64_t global_position) const;
  // With random_offsets: how many tokens window `window` of epoch `epoch` starts after its
  // aligned start (0 without).
  int shift_of(uint64_t epoch, size_t window) const;

 private:
  void build_epoch(uint64_t epoch);  // this rank's slice of perm_e
  std::vector<uint32_t> permutation(uint64_t epoch) const;

  std::shared_ptr<const TokenDataset> dataset_;
  SamplerOptions opt_;
  size_t n_ = 0;
  uint64_t epoch_ = 0;
  uint64_t position_ = 0;
  uint64_t built_epoch_ = UINT64_MAX;
  std::vector<uint32_t> mine_;  // perm_e[g + i*W], i in [0, samples_per_rank)
  std::vector<int32_t> row_;    // scratch: one window
};

}  // namespace geoloco::trainer

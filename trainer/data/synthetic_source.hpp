// Synthetic source with an exactly known entropy rate, so tests can tell "the model
// learned the data" (loss -> entropy_rate()) from "the loss went down".
//
// The source is a first-order Markov chain over V symbols. Row i of the (seeded, sparse)
// transition matrix allows k successors:
//   * (i + 1) mod V always -- the cycle makes the chain irreducible;
//   * state 0 also allows itself -- one self loop makes it aperiodic;
//   * the rest are distinct states drawn uniformly;
// with probabilities proportional to weights drawn in [0.05, 1.05) (or all equal when
// `uniform_rows`). Irreducible + aperiodic => a unique stationary distribution pi, found by
// power iteration on the lazy chain (P + I) / 2 (same pi, no oscillation). The entropy rate
// is then H = -sum_i pi_i sum_j P_ij log P_ij nats/token.
//
// A window is an independent stretch of the stationary chain: its first token is drawn from
// pi, the next T by the chain, with an Rng seeded by (stream_seed, window index) -- random
// access, deterministic, and independent of which rank or thread asks.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/rng.hpp"
#include "trainer/data/token_dataset.hpp"

namespace geoloco::trainer {

class MarkovChain {
 public:
  // 2 <= branching <= vocab. Throws geoloco::Error otherwise (config validation catches
  // user values first).
  MarkovChain(int vocab, int branching, uint64_t seed, bool uniform_rows = false);

  int vocab() const { return vocab_; }
  int branching() const { return k_; }
  std::span<const int32_t> successors(int state) const;
  std::span<const double> probabilities(int state) const;  // same order as successors()
  double probability(int from, int to) const;              // P[from][to], 0 if not allowed
  const std::vector<double>& stationary() const { return pi_; }
  // Exact (to double rounding) entropy rate in nats/token.
  double entropy_rate() const { return entropy_rate_; }

  int32_t sample_initial(Rng& rng) const;
  int32_t step(int32_t state, Rng& rng) const;

 private:
  int vocab_, k_;
  std::vector<int32_t> succ_;   // vocab * k
  std::vector<double> prob_;    // vocab * k
  std::vector<double> cum_;     // vocab * k, row-wise cumulative
  std::vector<double> pi_;      // stationary distribution
  std::vector<double> pi_cum_;  // cumulative pi for sampling the first token
  double entropy_rate_ = 0;
};

class SyntheticDataset final : public TokenDataset {
 public:
  // num_tokens sets how many windows exist: (num_tokens - 1) / T, like a stream of that length.
  SyntheticDataset(std::shared_ptr<const MarkovChain> chain, uint64_t stream_seed, uint64_t num_tokens);

  int vocab_size() const override { return chain_->vocab(); }
  size_t num_windows(int T) const override;
  void window(size_t index, int T, int32_t* out) const override;
  std::string describe() const override;

  const MarkovChain& chain() const { return *chain_; }
  double entropy_rate() const { return chain_->entropy_rate(); }

 private:
  std::shared_ptr<const MarkovChain> chain_;
  uint64_t stream_seed_, num_tokens_;
};

}  // namespace geoloco::trainer

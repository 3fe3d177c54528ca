#include "trainer/data/synthetic_source.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "core/error.hpp"

namespace geoloco::trainer {

MarkovChain::MarkovChain(int vocab, int branching, uint64_t seed, bool uniform_rows) : vocab_(vocab), k_(branching) {
  GEOLOCO_CHECK(vocab >= 2, "vocab {} must be >= 2", vocab);
  GEOLOCO_CHECK(branching >= 2 && branching <= vocab, "branching {} must be in [2, vocab={}]", branching, vocab);
  const size_t V = static_cast<size_t>(vocab), K = static_cast<size_t>(branching);
  succ_.resize(V * K);
  prob_.resize(V * K);
  cum_.resize(V * K);
  Rng rng(mix_seed(seed, 0x6d61726b6f76ULL /* "markov" */));
  std::vector<uint8_t> taken(V, 0);
  for (size_t i = 0; i < V; ++i) {
    int32_t* row = &succ_[i * K];
    size_t n = 0;
    auto take = [&](size_t s) {
      taken[s] = 1;
      row[n++] = static_cast<int32_t>(s);
    };
    take((i + 1) % V);
    if (i == 0 && !taken[0]) take(0);
    // Rejection sampling of distinct successors: deterministic given the Rng stream.
    while (n < K) {
      const size_t s = static_cast<size_t>(rng.below(V));
      if (!taken[s]) take(s);
    }
    for (size_t j = 0; j < K; ++j) taken[static_cast<size_t>(row[j])] = 0;
    double total = 0;
    for (size_t j = 0; j < K; ++j) {
      const double w = uniform_rows ? 1.0 : 0.05 + rng.uniform();
      prob_[i * K + j] = w;
      total += w;
    }
    double c = 0;
    for (size_t j = 0; j < K; ++j) {
      prob_[i * K + j] /= total;
      c += prob_[i * K + j];
      cum_[i * K + j] = c;
    }
    cum_[i * K + K - 1] = 1.0;  // no gap at the top from rounding
  }

  // Stationary distribution: power iteration on the lazy chain pi <- pi (P + I) / 2.
  pi_.assign(V, 1.0 / static_cast<double>(V));
  std::vector<double> next(V);
  for (int iter = 0; iter < 1000000; ++iter) {
    for (size_t s = 0; s < V; ++s) next[s] = 0.5 * pi_[s];
    for (size_t i = 0; i < V; ++i) {
      const double m = 0.5 * pi_[i];
      for (size_t j = 0; j < K; ++j) next[static_cast<size_t>(succ_[i * K + j])] += m * prob_[i * K + j];
    }
    double sum = 0;
    for (double x : next) sum += x;
    double diff = 0;
    for (size_t s = 0; s < V; ++s) {
      next[s] /= sum;
      diff = std::max(diff, std::abs(next[s] - pi_[s]));
    }
    pi_.swap(next);
    if (diff < 1e-15) break;
  }
  pi_cum_.resize(V);
  double c = 0;
  entropy_rate_ = 0;
  for (size_t i = 0; i < V; ++i) {
    c += pi_[i];
    pi_cum_[i] = c;
    double h = 0;
    for (size_t j = 0; j < K; ++j) {
      const double p = prob_[i * K + j];
      h -= p * std::log(p);
    }
    entropy_rate_ += pi_[i] * h;
  }
  pi_cum_[V - 1] = 1.0;
}

std::span<const int32_t> MarkovChain::successors(int state) const {
  GEOLOCO_CHECK(state >= 0 && state < vocab_, "state {} outside [0, {})", state, vocab_);
  return {succ_.data() + static_cast<size_t>(state) * static_cast<size_t>(k_), static_cast<size_t>(k_)};
}

std::span<const double> MarkovChain::probabilities(int state) const {
  GEOLOCO_CHECK(state >= 0 && state < vocab_, "state {} outside [0, {})", state, vocab_);
  return {prob_.data() + static_cast<size_t>(state) * static_cast<size_t>(k_), static_cast<size_t>(k_)};
}

double MarkovChain::probability(int from, int to) const {
  auto s = successors(from);
  auto p = probabilities(from);
  for (size_t j = 0; j < s.size(); ++j)
    if (s[j] == to) return p[j];
  return 0.0;
}

int32_t MarkovChain::sample_initial(Rng& rng) const {
  const double u = rng.uniform();
  const auto it = std::upper_bound(pi_cum_.begin(), pi_cum_.end(), u);
  return static_cast<int32_t>(std::min<ptrdiff_t>(it - pi_cum_.begin(), vocab_ - 1));
}

int32_t MarkovChain::step(int32_t state, Rng& rng) const {
  const double u = rng.uniform();
  const size_t base = static_cast<size_t>(state) * static_cast<size_t>(k_);
  for (size_t j = 0; j + 1 < static_cast<size_t>(k_); ++j)
    if (u < cum_[base + j]) return succ_[base + j];
  return succ_[base + static_cast<size_t>(k_) - 1];
}

SyntheticDataset::SyntheticDataset(std::shared_ptr<const MarkovChain> chain, uint64_t stream_seed, uint64_t num_tokens)
    : chain_(std::move(chain)), stream_seed_(stream_seed), num_tokens_(num_tokens) {
  GEOLOCO_CHECK(chain_ != nullptr, "null chain");
}

size_t SyntheticDataset::num_windows(int T) const {
  GEOLOCO_CHECK(T >= 1, "window length T={} must be >= 1", T);
  return num_tokens_ == 0 ? 0 : static_cast<size_t>((num_tokens_ - 1) / static_cast<uint64_t>(T));
}

void SyntheticDataset::window(size_t index, int T, int32_t* out) const {
  const size_t n = num_windows(T);
  GEOLOCO_CHECK(index < n, "window {} out of range ({} windows of T={})", index, n, T);
  Rng rng(mix_seed(stream_seed_, index));
  int32_t s = chain_->sample_initial(rng);
  out[0] = s;
  for (int t = 1; t <= T; ++t) {
    s = chain_->step(s, rng);
    out[t] = s;
  }
}

std::string SyntheticDataset::describe() const {
  return fmt::format("synthetic markov(vocab {}, branching {}, entropy {:.6f} nats/token) {} tokens", chain_->vocab(),
                     chain_->branching(), chain_->entropy_rate(), num_tokens_);
}

}  // namespace geoloco::trainer

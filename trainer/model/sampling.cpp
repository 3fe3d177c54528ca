#include "trainer/model/sampling.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "core/error.hpp"

namespace geoloco::trainer {

int32_t sample_token(std::span<const float> probs, const SamplingOptions& o, Rng& rng) {
  if (probs.empty()) throw InputError("sampling: empty distribution");
  if (!(o.temperature >= 0) || !std::isfinite(o.temperature))
    throw InputError(fmt::format("sampling: temperature {} must be a finite number >= 0", o.temperature));
  if (o.top_k < 0) throw InputError(fmt::format("sampling: top_k {} must be >= 0", o.top_k));
  const size_t V = probs.size();
  const size_t k = o.top_k == 0 ? V : std::min<size_t>(V, static_cast<size_t>(o.top_k));
  // The k most likely ids, most likely first, lower id first among equals.
  std::vector<int32_t> ids(V);
  std::iota(ids.begin(), ids.end(), 0);
  auto more_likely = [&](int32_t a, int32_t b) {
    return probs[size_t(a)] > probs[size_t(b)] || (probs[size_t(a)] == probs[size_t(b)] && a < b);
  };
  std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end(), more_likely);
  if (o.temperature == 0) return ids[0];
  // p^(1/t) in log space, relative to the most likely (no overflow for small t); a zero
  // probability stays zero.
  const double top = std::log(double(probs[size_t(ids[0])]));
  std::vector<double> w(k);
  double sum = 0;
  for (size_t i = 0; i < k; ++i) {
    const double p = probs[size_t(ids[i])];
    w[i] = p > 0 ? std::exp((std::log(p) - top) / o.temperature) : 0.0;
    sum += w[i];
  }
  if (!(sum > 0) || !std::isfinite(sum)) throw InputError("sampling: the distribution has no positive probability");
  double u = rng.uniform() * sum;
  for (size_t i = 0; i < k; ++i) {
    if (u < w[i]) return ids[i];
    u -= w[i];
  }
  return ids[k - 1];  // rounding left u at the very end
}

std::vector<int32_t> generate(Gpt& model, std::span<const float> params, std::span<const int32_t> prompt, int count,
                              const SamplingOptions& options, uint64_t seed) {
  const ModelConfig& cfg = model.config();
  if (prompt.empty()) throw InputError("sampling: the prompt needs at least one token");
  if (count < 0) throw InputError(fmt::format("sampling: {} tokens requested", count));
  for (size_t i = 0; i < prompt.size(); ++i)
    if (prompt[i] < 0 || prompt[i] >= cfg.vocab_size)
      throw InputError(
          fmt::format("sampling: prompt token {} at position {} is outside [0, {})", prompt[i], i, cfg.vocab_size));
  std::vector<int32_t> context(prompt.begin(), prompt.end()), out;
  out.reserve(size_t(count));
  std::vector<int32_t> targets(size_t(cfg.block_size), 0);  // unused: only the probabilities are read
  Rng rng(seed);
  const size_t V = size_t(cfg.vocab_size);
  for (int n = 0; n < count; ++n) {
    const size_t T = std::min(context.size(), size_t(cfg.block_size));
    const int32_t* window = context.data() + (context.size() - T);
    model.evaluate(params, window, targets.data(), 1, static_cast<int>(T));
    const auto last = model.probs().subspan((T - 1) * V, V);
    const int32_t next = sample_token(last, options, rng);
    context.push_back(next);
    out.push_back(next);
  }
  return out;
}

}  // namespace geoloco::trainer

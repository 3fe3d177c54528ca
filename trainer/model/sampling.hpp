// Text generation from a trained model, for looking at what it learned (`geoloco sample`):
// one token at a time, each drawn from the model's next-token distribution with temperature
// and top-k, from a seeded Rng, so the same checkpoint, prompt and seed give the same text.
// A full forward over the last block_size tokens per token (no KV cache): fine for the
// sanity check this is, not a serving path.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/rng.hpp"
#include "trainer/model/gpt.hpp"

namespace geoloco::trainer {

struct SamplingOptions {
  double temperature = 0.8;  // > 0: sharpen (< 1) or flatten (> 1); 0: always the most likely token
  int top_k = 40;            // draw among the k most likely tokens; 0: all
};

// One token from `probs` (a softmax at temperature 1 over the vocabulary): probabilities
// raised to 1/temperature, renormalised over the top_k most likely (ties: the lower id first).
// InputError for an empty distribution or options out of range.
int32_t sample_token(std::span<const float> probs, const SamplingOptions& options, Rng& rng);

// `prompt` (non-empty, ids < vocab_size; longer than block_size: its last block_size tokens
// are the context) continued by `count` tokens. Returns only the new tokens.
std::vector<int32_t> generate(Gpt& model, std::span<const float> params, std::span<const int32_t> prompt, int count,
                              const SamplingOptions& options, uint64_t seed);

}  // namespace geoloco::trainer

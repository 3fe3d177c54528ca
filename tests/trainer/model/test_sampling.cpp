// Sampling: the distribution each option defines, drawn exactly (seeded), and generation
// that is deterministic and windows long contexts.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.hpp"
#include "trainer/model/sampling.hpp"

using namespace geoloco;
using namespace geoloco::trainer;

namespace {

// Frequencies of n draws.
std::vector<double> frequencies(const std::vector<float>& p, const SamplingOptions& o, int n, uint64_t seed) {
  Rng rng(seed);
  std::vector<double> f(p.size(), 0);
  for (int i = 0; i < n; ++i) f[size_t(sample_token(p, o, rng))] += 1.0 / n;
  return f;
}

// Within 5 standard deviations of a binomial proportion (seeded: this is a fixed outcome,
// the bound only says the sampler draws the distribution it claims).
void expect_close(const std::vector<double>& f, const std::vector<double>& want, int n) {
  ASSERT_EQ(f.size(), want.size());
  for (size_t i = 0; i < f.size(); ++i)
    EXPECT_NEAR(f[i], want[i], 5 * std::sqrt(want[i] * (1 - want[i]) / n) + 1e-12) << "token " << i;
}

}  // namespace

TEST(Sampling, TemperatureZeroAndTopOneAreTheMostLikelyToken) {
  Rng rng(1);
  const std::vector<float> p = {0.1f, 0.4f, 0.4f, 0.1f};  // tie: the lower id
  EXPECT_EQ(sample_token(p, {0.0, 0}, rng), 1);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(sample_token(p, {5.0, 1}, rng), 1);
}

TEST(Sampling, DrawsTheDistributionEachOptionDefines) {
  const std::vector<float> p = {0.5f, 0.3f, 0.2f};
  const int n = 40000;
  expect_close(frequencies(p, {1.0, 0}, n, 7), {0.5, 0.3, 0.2}, n);
  expect_close(frequencies(p, {1.0, 2}, n, 8), {0.625, 0.375, 0.0}, n);  // top 2, renormalised
  // Temperature 0.5: p^2 renormalised.
  expect_close(frequencies(p, {0.5, 0}, n, 9), {0.25 / 0.38, 0.09 / 0.38, 0.04 / 0.38}, n);
  // A zero probability is never drawn, whatever the temperature.
  const auto f = frequencies({0.0f, 1.0f}, {3.0, 0}, 1000, 10);
  EXPECT_EQ(f[0], 0.0);
}

TEST(Sampling, BadOptionsAreInputErrors) {
  Rng rng(1);
  const std::vector<float> p = {1.0f};
  EXPECT_THROW(sample_token({}, {1.0, 0}, rng), InputError);
  EXPECT_THROW(sample_token(p, {-1.0, 0}, rng), InputError);
  EXPECT_THROW(sample_token(p, {std::nan(""), 0}, rng), InputError);
  EXPECT_THROW(sample_token(p, {1.0, -3}, rng), InputError);
  EXPECT_THROW(sample_token(std::vector<float>{0.0f, 0.0f}, {1.0, 0}, rng), InputError);
}

TEST(Sampling, GenerateIsDeterministicAndWindowsLongPrompts) {
  const ModelConfig c{.n_layer = 1, .n_head = 2, .n_embd = 16, .block_size = 8, .vocab_size = 11};
  Gpt m(c);
  std::vector<float> params(size_t(m.layout().total()));
  Gpt::init_params(m.layout(), params, 5);
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0, 1};  // longer than block_size
  const auto a = generate(m, params, prompt, 20, {1.0, 0}, 42);
  const auto b = generate(m, params, prompt, 20, {1.0, 0}, 42);
  const auto other = generate(m, params, prompt, 20, {1.0, 0}, 43);
  ASSERT_EQ(a.size(), 20u);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, other);
  for (int32_t t : a) EXPECT_TRUE(t >= 0 && t < c.vocab_size) << t;
  // Greedy: each token is the argmax of the model's distribution after the last 8 tokens.
  const auto greedy = generate(m, params, prompt, 3, {0.0, 0}, 1);
  std::vector<int32_t> ctx = prompt;
  std::vector<int32_t> tg(8, 0);
  for (int32_t t : greedy) {
    m.evaluate(params, ctx.data() + ctx.size() - 8, tg.data(), 1, 8);
    const auto last = m.probs().subspan(7 * 11, 11);
    EXPECT_EQ(t, std::max_element(last.begin(), last.end()) - last.begin());
    ctx.push_back(t);
  }
  EXPECT_THROW(generate(m, params, std::vector<int32_t>{}, 3, {}, 1), InputError);
  EXPECT_THROW(generate(m, params, std::vector<int32_t>{11}, 3, {}, 1), InputError);
}

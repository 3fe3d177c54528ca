// Synthetic Markov source: the entropy rate is exact (closed forms where they exist, an
// empirical estimate on a large sample otherwise), windows are deterministic chain paths.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "core/error.hpp"
#include "trainer/data/open_data.hpp"
#include "trainer/data/sampler.hpp"
#include "trainer/data/synthetic_source.hpp"

using namespace geoloco;
using namespace geoloco::trainer;

TEST(MarkovChain, UniformRowsHaveEntropyLogK) {
  // Every row uniform over k successors: H = log k whatever pi is.
  for (int k : {2, 3, 8}) {
    MarkovChain c(64, k, 7, /*uniform_rows=*/true);
    EXPECT_NEAR(c.entropy_rate(), std::log(static_cast<double>(k)), 1e-12) << "k=" << k;
  }
}

TEST(MarkovChain, TwoStateChainMatchesClosedForm) {
  // Two states, both successors allowed: pi_0 = P10 / (P01 + P10),
  // H = pi_0 h(P00) + pi_1 h(P11) with h the binary entropy.
  MarkovChain c(2, 2, 99);
  const double p01 = c.probability(0, 1), p10 = c.probability(1, 0);
  const double pi0 = p10 / (p01 + p10), pi1 = 1 - pi0;
  auto h = [](double p) { return -p * std::log(p) - (1 - p) * std::log(1 - p); };
  EXPECT_NEAR(c.stationary()[0], pi0, 1e-13);
  EXPECT_NEAR(c.entropy_rate(), pi0 * h(p01) + pi1 * h(p10), 1e-13);
}

TEST(MarkovChain, RowsAreDistributionsAndPiIsStationary) {
  MarkovChain c(100, 5, 3);
  for (int i = 0; i < 100; ++i) {
    auto s = c.successors(i);
    auto p = c.probabilities(i);
    ASSERT_EQ(s.size(), 5u);
    EXPECT_EQ(s[0], (i + 1) % 100);  // the cycle edge that makes the chain irreducible
    double sum = 0;
    for (size_t j = 0; j < s.size(); ++j) {
      EXPECT_GT(p[j], 0.0);
      for (size_t k = 0; k < j; ++k) EXPECT_NE(s[j], s[k]) << "duplicate successor in row " << i;
      sum += p[j];
    }
    EXPECT_NEAR(sum, 1.0, 1e-14);
  }
  EXPECT_GT(c.probability(0, 0), 0.0);  // the self loop that makes it aperiodic
  // pi P = pi, sum pi = 1 (double rounding on a 100-state sum: 1e-12 is generous).
  std::vector<double> next(100, 0.0);
  double total = 0;
  for (int i = 0; i < 100; ++i) {
    total += c.stationary()[static_cast<size_t>(i)];
    auto s = c.successors(i);
    auto p = c.probabilities(i);
    for (size_t j = 0; j < s.size(); ++j)
      next[static_cast<size_t>(s[j])] += c.stationary()[static_cast<size_t>(i)] * p[j];
  }
  EXPECT_NEAR(total, 1.0, 1e-12);
  for (int i = 0; i < 100; ++i)
    EXPECT_NEAR(next[static_cast<size_t>(i)], c.stationary()[static_cast<size_t>(i)], 1e-12);
}

TEST(SyntheticDataset, EntropyRateMatchesEmpiricalEstimate) {
  auto chain = std::make_shared<const MarkovChain>(64, 4, 2024);
  SyntheticDataset d(chain, 5, 1ull << 30);
  const int T = 256;
  const size_t windows = 8000;  // ~2M transitions
  std::vector<double> count(64 * 64, 0.0), from(64, 0.0), visits(64, 0.0);
  std::vector<int32_t> w(T + 1);
  double nll = 0;
  size_t n = 0;
  for (size_t i = 0; i < windows; ++i) {
    d.window(i, T, w.data());
    for (int t = 0; t <= T; ++t) visits[static_cast<size_t>(w[static_cast<size_t>(t)])] += 1;
    for (int t = 0; t < T; ++t) {
      const int a = w[static_cast<size_t>(t)], b = w[static_cast<size_t>(t) + 1];
      const double p = chain->probability(a, b);
      ASSERT_GT(p, 0.0) << "transition " << a << "->" << b << " is not allowed";
      nll -= std::log(p);
      count[static_cast<size_t>(a * 64 + b)] += 1;
      from[static_cast<size_t>(a)] += 1;
      ++n;
    }
  }
  // Two estimates of H: the true model's mean NLL, and the plug-in conditional entropy of the
  // empirical counts. Their standard errors are ~ sd(-log P) / sqrt(n) ~ 0.6 / 1414 = 4e-4;
  // 4e-3 is 10 sigma. The plug-in bias, ~ V(k-1) / 2n = 5e-5, is well inside it.
  const double H = chain->entropy_rate();
  EXPECT_NEAR(nll / static_cast<double>(n), H, 4e-3);
  double plug = 0;
  for (size_t a = 0; a < 64; ++a)
    for (size_t b = 0; b < 64; ++b)
      if (count[a * 64 + b] > 0)
        plug -= count[a * 64 + b] / static_cast<double>(n) * std::log(count[a * 64 + b] / from[a]);
  EXPECT_NEAR(plug, H, 4e-3);
  // State frequencies match pi (windows start stationary): each within 5e-3 (pi_i ~ 1/64,
  // sd of a frequency over ~2M correlated draws ~ 3e-4).
  const double total = static_cast<double>(windows) * (T + 1);
  for (size_t s = 0; s < 64; ++s) EXPECT_NEAR(visits[s] / total, chain->stationary()[s], 5e-3) << "state " << s;
  // Not degenerate: well above 0 and below log k.
  EXPECT_GT(H, 0.5);
  EXPECT_LT(H, std::log(4.0));
}

TEST(SyntheticDataset, WindowsAreDeterministicAndRandomAccess) {
  auto c1 = std::make_shared<const MarkovChain>(50, 3, 11);
  auto c2 = std::make_shared<const MarkovChain>(50, 3, 11);
  SyntheticDataset a(c1, 1, 1000), b(c2, 1, 1000), other(c1, 2, 1000);
  EXPECT_EQ(a.num_windows(9), 111u);  // (1000 - 1) / 9
  std::vector<int32_t> x(10), y(10), z(10);
  // Reading in a different order gives the same windows.
  for (size_t i : {5u, 0u, 110u}) {
    a.window(i, 9, x.data());
    b.window(i, 9, y.data());
    EXPECT_EQ(x, y);
    other.window(i, 9, z.data());
    EXPECT_NE(x, z) << "a different stream seed gave the same window " << i;
  }
  a.window(3, 9, x.data());
  a.window(4, 9, y.data());
  EXPECT_NE(x, y);
  EXPECT_THROW(a.window(111, 9, x.data()), Error);
}

TEST(SyntheticDataset, ChainStructureDependsOnSeed) {
  MarkovChain a(30, 4, 1), b(30, 4, 2);
  bool differs = false;
  for (int i = 0; i < 30; ++i)
    for (int j = 0; j < 30; ++j) differs |= a.probability(i, j) != b.probability(i, j);
  EXPECT_TRUE(differs);
}

TEST(SyntheticDataset, ImplicitValSplitSharesTheChainWithOtherWindows) {
  DataConfig cfg;
  cfg.train.kind = DataSourceConfig::Kind::Synthetic;
  cfg.train.vocab = 40;
  cfg.train.branching = 3;
  cfg.train.seed = 8;
  cfg.train.tokens = 10000;
  auto s = open_data(cfg, {}, 256);
  auto* tr = dynamic_cast<const SyntheticDataset*>(s.train.get());
  auto* va = dynamic_cast<const SyntheticDataset*>(s.val.get());
  ASSERT_TRUE(tr && va);
  EXPECT_EQ(&tr->chain(), &va->chain());
  std::vector<int32_t> x(17), y(17);
  tr->window(0, 16, x.data());
  va->window(0, 16, y.data());
  EXPECT_NE(x, y);
  // An explicit val source with the same parameters uses the val stream too.
  cfg.val = cfg.train;
  auto s2 = open_data(cfg, {}, 256);
  std::vector<int32_t> z(17);
  s2.val->window(0, 16, z.data());
  EXPECT_EQ(y, z);
  EXPECT_THROW(open_data(cfg, {}, 39), InputError);  // vocab 40 > model vocab 39
}

TEST(SyntheticDataset, BigramLearnedFromSamplerBatchesReachesEntropyRateOnVal) {
  // End to end through config -> open_data -> sampler: the Bayes-optimal model of a
  // first-order chain is its bigram table, so a bigram count model fitted on training
  // batches must score ~ entropy_rate() nats/token on the validation split. This is the
  // yardstick a trained GPT is held to.
  auto doc = config::load_string(
      "data: {train: {kind: synthetic, vocab: 64, branching: 4, seed: 31, tokens: 4194304}}\n", "run.yaml");
  auto splits = open_data(DataConfig::from_yaml(doc.node().child("data")), {}, 64);
  const int T = 64, B = 32, V = 64;
  DistributedSampler sampler(splits.train, SamplerOptions{5, 1, 0, T, true});
  std::vector<double> count(V * V, 0.01), row(V, 0.01 * V);  // add-0.01 smoothing
  std::vector<int32_t> in(B * T), tg(B * T);
  for (int step = 0; step < 500; ++step) {
    sampler.next_batch(B, T, in.data(), tg.data());
    for (size_t i = 0; i < in.size(); ++i) {
      count[static_cast<size_t>(in[i] * V + tg[i])] += 1;
      row[static_cast<size_t>(in[i])] += 1;
    }
  }
  const double H = dynamic_cast<const SyntheticDataset&>(*splits.val).entropy_rate();
  std::vector<int32_t> w(T + 1);
  double nll = 0;
  size_t n = 0;
  for (size_t i = 0; i < 500; ++i) {
    splits.val->window(i, T, w.data());
    for (int t = 0; t < T; ++t) {
      const auto a = static_cast<size_t>(w[static_cast<size_t>(t)]),
                 b = static_cast<size_t>(w[static_cast<size_t>(t) + 1]);
      nll -= std::log(count[a * V + b] / row[a]);
      ++n;
    }
  }
  // Val noise ~ 0.6 / sqrt(32000) = 3e-3 and the fitted table's excess loss ~ V*k / 2N
  // = 1e-4: 0.02 is > 6 sigma.
  EXPECT_NEAR(nll / static_cast<double>(n), H, 0.02);
}

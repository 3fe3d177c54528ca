// A test double of the outer loop's seam (outer_optimizer/site.hpp): one rank holding a whole
// toy model in a host vector, "trained" by a deterministic drift that differs by site and step,
// so tests drive the outer loop directly -- no trainer, no run config, no CLI -- and know what
// every site's weights must be.
#pragma once

#include <atomic>
#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "outer_optimizer/outer_options.hpp"
#include "outer_optimizer/site.hpp"

namespace geoloco::testing {

// A toy model: an embedding table, `blocks` blocks of a matrix and a bias, a final norm.
inline outer::ModelParams toy_model(int blocks = 4, int64_t width = 16, int64_t vocab = 48) {
  outer::ModelParams p;
  auto add = [&](std::string name, int64_t rows, int64_t cols, int block) {
    p.tensors.push_back({std::move(name), p.total, rows, cols, block});
    p.total += rows * cols;
  };
  add("embed", vocab, width, -1);
  for (int b = 0; b < blocks; ++b) {
    add("blocks." + std::to_string(b) + ".w", width, width, b);
    add("blocks." + std::to_string(b) + ".b", 1, width, b);
  }
  add("norm", 1, width, -1);
  return p;
}

// The same initial weights at every site.
inline std::vector<float> toy_init(int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.02f * static_cast<float>(std::sin(0.5 * double(i)));
  return v;
}

class FakeSite final : public outer::Site {
 public:
  FakeSite(int site, std::vector<float> params) : site_(site), params_(std::move(params)) {}

  int rank() const override { return 0; }
  int ranks() const override { return 1; }
  ShardRange shard() const override { return {0, static_cast<int64_t>(params_.size())}; }
  std::span<float> shard_params() override { return params_; }
  void shard_updated() override { ++merges; }
  void reset_inner_state() override { ++resets; }
  void write_plans(const nlohmann::json& p) override { plans = p; }

  // One inner step: every weight moves by an amount of its own, this site's and the step's.
  void train(int64_t step) {
    for (size_t i = 0; i < params_.size(); ++i)
      params_[i] -= 0.01f * static_cast<float>(std::sin(0.37 * double(i) + 1.3 * site_ + 0.11 * double(step)));
  }
  const std::vector<float>& params() const { return params_; }

  int merges = 0, resets = 0;
  nlohmann::json plans;

 private:
  int site_;
  std::vector<float> params_;
};

}  // namespace geoloco::testing

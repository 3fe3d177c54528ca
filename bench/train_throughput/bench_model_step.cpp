// Times geoloco's CPU training step -- Gpt forward + backward + a plain AdamW update, the
// same work torch_gpt.py does per step -- on random tokens and prints one JSON document.
// run.sh pairs it with the PyTorch peer; later the integrator points run.sh at `geoloco train`.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <ctime>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/rng.hpp"
#include "trainer/model/blas_setup.hpp"
#include "trainer/model/gpt.hpp"

namespace {

using geoloco::trainer::Gpt;
using geoloco::trainer::ModelConfig;

// AdamW (decoupled weight decay on 2-D weights only, as torch_gpt.py's peer applies it to
// all params: the arithmetic per float is the same either way).
struct AdamW {
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, wd = 0.1f;
  std::vector<float> m, v;
  int64_t t = 0;
  void step(std::vector<float>& p, const std::vector<float>& g) {
    if (m.empty()) m.assign(p.size(), 0.0f), v.assign(p.size(), 0.0f);
    ++t;
    const float c1 = 1.0f / (1.0f - std::pow(beta1, float(t))), c2 = 1.0f / (1.0f - std::pow(beta2, float(t)));
    const int64_t n = static_cast<int64_t>(p.size());
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      m[i] = beta1 * m[i] + (1.0f - beta1) * g[i];
      v[i] = beta2 * v[i] + (1.0f - beta2) * g[i] * g[i];
      p[i] -= lr * (m[i] * c1 / (std::sqrt(v[i] * c2) + eps) + wd * p[i]);
    }
  }
};

double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// Writes a NumPy .npy file (format 1.0: magic, version, header dict padded to 64 bytes),
// which numpy reads with its own checks; used by --dump_dir for check_vs_torch.py.
template <class T>
void write_npy(const std::string& path, const char* descr, const std::vector<int64_t>& shape, const T* data) {
  std::string dims;
  int64_t n = 1;
  for (auto d : shape) dims += std::to_string(d) + ",", n *= d;
  std::string header = "{'descr': '" + std::string(descr) + "', 'fortran_order': False, 'shape': (" + dims + "), }";
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::ofstream f(path, std::ios::binary);
  const uint16_t len = static_cast<uint16_t>(header.size());
  f.write("\x93NUMPY\x01\x00", 8);
  f.write(reinterpret_cast<const char*>(&len), 2);
  f << header;
  f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(sizeof(T) * size_t(n)));
  if (!f) throw std::runtime_error("cannot write " + path);
}

}  // namespace

int main(int argc, char** argv) {
  geoloco::trainer::prefer_avx512_blas(argv);
  CLI::App app{"geoloco CPU GPT-2 training-step benchmark"};
  ModelConfig cfg;
  cfg.n_layer = 2, cfg.n_head = 4, cfg.n_embd = 128, cfg.block_size = 64, cfg.vocab_size = 256;
  int batch = 8, seq = 64, steps = 50, warmup = 5, threads = 1;
  uint64_t seed = 1;
  std::string dump_dir;
  app.add_option("--n_layer", cfg.n_layer)->check(CLI::PositiveNumber);
  app.add_option("--n_head", cfg.n_head)->check(CLI::PositiveNumber);
  app.add_option("--n_embd", cfg.n_embd)->check(CLI::PositiveNumber);
  app.add_option("--block_size", cfg.block_size)->check(CLI::PositiveNumber);
  app.add_option("--vocab_size", cfg.vocab_size)->check(CLI::PositiveNumber);
  app.add_option("--batch", batch)->check(CLI::PositiveNumber);
  app.add_option("--seq", seq)->check(CLI::PositiveNumber);
  app.add_option("--steps", steps)->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup)->check(CLI::NonNegativeNumber);
  app.add_option("--threads", threads)->check(CLI::PositiveNumber);
  app.add_option("--seed", seed);
  app.add_option("--dump_dir", dump_dir,
                 "write x, y, params, grads (.npy) and meta.json of one fwd+bwd to this existing folder, then exit "
                 "(for check_vs_torch.py)");
  CLI11_PARSE(app, argc, argv);

  try {
    Gpt::set_num_threads(threads);
    Gpt gpt(cfg);
    std::vector<float> params(gpt.layout().total()), grads(params.size());
    Gpt::init_params(gpt.layout(), params, seed);
    std::vector<int32_t> x(size_t(batch) * seq), y(x.size());
    geoloco::Rng rng(seed + 1);
    for (auto& t : x) t = int32_t(rng.below(uint64_t(cfg.vocab_size)));
    for (auto& t : y) t = int32_t(rng.below(uint64_t(cfg.vocab_size)));
    if (!dump_dir.empty()) {
      std::fill(grads.begin(), grads.end(), 0.0f);
      const float l = gpt.forward(params, x.data(), y.data(), batch, seq);
      gpt.backward(params, grads);
      write_npy(dump_dir + "/x.npy", "<i4", {batch, seq}, x.data());
      write_npy(dump_dir + "/y.npy", "<i4", {batch, seq}, y.data());
      write_npy(dump_dir + "/params.npy", "<f4", {int64_t(params.size())}, params.data());
      write_npy(dump_dir + "/grads.npy", "<f4", {int64_t(grads.size())}, grads.data());
      nlohmann::json meta = {{"n_layer", cfg.n_layer},       {"n_head", cfg.n_head},         {"n_embd", cfg.n_embd},
                             {"block_size", cfg.block_size}, {"vocab_size", cfg.vocab_size}, {"loss", l}};
      std::ofstream(dump_dir + "/meta.json") << meta.dump() << "\n";
      std::printf("%s\n", meta.dump().c_str());
      return 0;
    }
    AdamW opt;
    float loss = 0;
    auto step = [&] {
      std::fill(grads.begin(), grads.end(), 0.0f);
      loss = gpt.forward(params, x.data(), y.data(), batch, seq);
      gpt.backward(params, grads);
      opt.step(params, grads);
    };
    for (int i = 0; i < warmup; ++i) step();
    // Wall time is the figure; process CPU time is reported too because on a shared, busy
    // machine it is the steadier of the two (it excludes time spent waiting for a core).
    const double c0 = cpu_seconds();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < steps; ++i) step();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double cpu = cpu_seconds() - c0;
    nlohmann::json out = {{"impl", "geoloco"},
                          {"threads", threads},
                          {"n_layer", cfg.n_layer},
                          {"n_head", cfg.n_head},
                          {"n_embd", cfg.n_embd},
                          {"block_size", cfg.block_size},
                          {"vocab_size", cfg.vocab_size},
                          {"batch", batch},
                          {"seq", seq},
                          {"n_params", gpt.layout().total()},
                          {"steps", steps},
                          {"seconds", dt},
                          {"steps_per_s", steps / dt},
                          {"tokens_per_s", double(steps) * batch * seq / dt},
                          {"cpu_seconds", cpu},
                          {"tokens_per_cpu_s", double(steps) * batch * seq / cpu},
                          {"final_loss", loss},
                          {"blas", geoloco::trainer::blas_description()}};
    std::printf("%s\n", out.dump().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_model_step: %s\n", e.what());
    return 1;
  }
  return 0;
}

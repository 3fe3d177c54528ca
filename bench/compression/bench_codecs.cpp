// bench_codecs: single-thread encode/decode throughput, bytes on the wire and reconstruction
// error of every codec, with and without zstd, on synthetic pseudo-gradients (64 MiB by
// default) and optionally on captured ones (--real: raw little-endian .f32, or a
// .safetensors file whose F32 tensors are concatenated in file order).
//
// Prints one JSON document. The peer figure is memcpy of the same fp32 bytes on the same
// core (the floor any codec pass is measured against); "targets" checks the goals:
// int8 encode+decode >= 1 GB/s per core, and the 4-bit codecs with zstd >= 8x smaller.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>

#include "compression/bytes.hpp"
#include "compression/pipeline.hpp"
#include "compression/synthetic.hpp"
#include "core/error.hpp"

using namespace geoloco;
using namespace geoloco::compression;
using Clock = std::chrono::steady_clock;

namespace {

std::vector<uint8_t> read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw FileError(path, "cannot open");
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// F32 tensors of a safetensors file, concatenated in the order the header lists them.
std::vector<float> read_safetensors(const std::string& path) {
  const auto b = read_all(path);
  if (b.size() < 8) throw FileError(path, "too short for a safetensors header");
  const uint64_t hlen = bytes::load<uint64_t>(b.data());
  if (hlen > b.size() - 8) throw FileError(path, "header length past the end of the file");
  const auto header = nlohmann::json::parse(b.begin() + 8, b.begin() + 8 + static_cast<long>(hlen));
  const size_t base = 8 + hlen;
  // Tensors in file order (by data offset); the JSON object itself is unordered.
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  for (const auto& [name, t] : header.items()) {
    if (name == "__metadata__") continue;
    if (t.at("dtype") != "F32")
      throw FileError(path, "tensor " + name + " is " + t.at("dtype").get<std::string>() + ", only F32 is read");
    const uint64_t lo = t.at("data_offsets").at(0), hi = t.at("data_offsets").at(1);
    if (lo > hi || hi > b.size() - base || (hi - lo) % 4)
      throw FileError(path, "tensor " + name + " has bad data_offsets");
    spans.emplace_back(lo, hi);
  }
  std::sort(spans.begin(), spans.end());
  std::vector<float> out;
  for (const auto& [lo, hi] : spans) {
    const size_t n = (hi - lo) / 4;
    const size_t at = out.size();
    out.resize(at + n);
    std::memcpy(out.data() + at, b.data() + base + lo, n * 4);
  }
  return out;
}

std::vector<float> read_real(const std::string& path) {
  if (path.size() > 12 && path.substr(path.size() - 12) == ".safetensors") return read_safetensors(path);
  const auto b = read_all(path);
  if (b.size() % 4) throw FileError(path, "raw .f32 file size is not a multiple of 4");
  std::vector<float> out(b.size() / 4);
  std::memcpy(out.data(), b.data(), b.size());
  return out;
}

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Best of `reps` runs, timed in this thread's CPU time: the figure is "per core", and on a
// shared machine wall time mostly measures how long other processes held the core.
// (--wall switches to wall-clock time.)
bool g_wall_clock = false;
template <class F>
double best_seconds(int reps, F&& f) {
  double best = 1e300;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    const double c0 = thread_cpu_seconds();
    f();
    const double cpu = thread_cpu_seconds() - c0;
    const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::min(best, g_wall_clock ? wall : cpu);
  }
  return best;
}

double rel_l2(std::span<const float> x, std::span<const float> y) {
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double d = double(x[i]) - y[i];
    num += d * d;
    den += double(x[i]) * x[i];
  }
  return den > 0 ? std::sqrt(num / den) : 0.0;
}

nlohmann::json bench_one(const PipelineConfig& cfg, std::span<const float> x, int reps) {
  Pipeline p(cfg);
  std::vector<uint8_t> frame;
  std::vector<float> y(x.size());
  ErrorFeedback ef(x.size());
  const double gb = x.size() * 4.0 / 1e9;
  const double t_enc = best_seconds(reps, [&] { p.encode(x, nullptr, frame); });
  const double t_dec = best_seconds(reps, [&] { p.decode(frame, x.size(), y); });
  PipelineConfig with_ef = cfg;
  with_ef.error_feedback = true;
  Pipeline pe(with_ef);
  std::vector<uint8_t> frame2;
  const double t_enc_ef = best_seconds(reps, [&] { pe.encode(x, &ef, frame2); });
  const FrameInfo info = Pipeline::inspect(frame, x.size());
  return {{"config", cfg.describe()},
          {"codec", codec_name(cfg.codec)},
          {"zstd_level", cfg.zstd_level},
          {"topk", cfg.topk ? *cfg.topk : 1.0},
          {"zstd_applied", info.zstd},
          {"encode_gbps", gb / t_enc},
          {"decode_gbps", gb / t_dec},
          {"encode_decode_gbps", gb / (t_enc + t_dec)},
          {"encode_with_error_feedback_gbps", gb / t_enc_ef},
          {"wire_bytes", frame.size()},
          {"fp32_bytes", x.size() * 4},
          {"ratio_vs_fp32", info.ratio()},
          {"bits_per_value", 8.0 * frame.size() / x.size()},
          {"rel_l2_error", rel_l2(x, y)}};
}

nlohmann::json bench_data(const std::string& name, std::span<const float> x, uint32_t block, int reps,
                          const std::string& only, const std::vector<int>& zstd_levels) {
  nlohmann::json rows = nlohmann::json::array();
  std::vector<PipelineConfig> configs;
  for (Codec c : {Codec::kFp32, Codec::kFp16, Codec::kBf16, Codec::kInt8, Codec::kInt4, Codec::kFp4, Codec::kInt2})
    for (int z : zstd_levels) {
      PipelineConfig cfg;
      cfg.codec = c;
      cfg.block = block;
      cfg.zstd_level = z;
      configs.push_back(cfg);
    }
  for (Codec c : {Codec::kInt8, Codec::kInt4})
    for (int z : zstd_levels) {
      PipelineConfig cfg;
      cfg.codec = c;
      cfg.block = block;
      cfg.topk = 0.1;
      cfg.zstd_level = z;
      configs.push_back(cfg);
    }
  for (const auto& cfg : configs) {
    if (!only.empty() && ("," + only + ",").find("," + cfg.describe() + ",") == std::string::npos) continue;
    rows.push_back(bench_one(cfg, x, reps));
    std::cerr << name << " " << rows.back().dump() << "\n";
  }
  std::vector<float> dst(x.size());
  const double t_copy = best_seconds(reps, [&] { std::memcpy(dst.data(), x.data(), x.size() * 4); });
  return {{"data", name},
          {"elements", x.size()},
          {"block", block},
          {"memcpy_gbps", x.size() * 4.0 / 1e9 / t_copy},
          {"rows", rows}};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("bench_codecs: compression codec throughput, ratio and error (JSON on stdout)");
  size_t mib = 64;
  uint32_t block = 128;
  int reps = 3;
  std::string real;
  uint64_t seed = 1;
  std::string only;
  std::vector<int> zstd_levels = {0, 3};
  app.add_option("--mib", mib, "synthetic data size in MiB of fp32")->check(CLI::Range(1, 4096));
  app.add_option("--block", block, "block size for every codec")->check(CLI::Range(16, 65536));
  app.add_option("--reps", reps, "repetitions; the best time counts")->check(CLI::Range(1, 100));
  app.add_option("--real", real, "captured pseudo-gradients: raw .f32 or .safetensors (F32 tensors)");
  app.add_option("--seed", seed, "synthetic data seed");
  app.add_option("--zstd", zstd_levels, "zstd levels to run per codec (0 = off)")
      ->delimiter(',')
      ->check(CLI::Range(0, 19));
  app.add_flag("--wall", g_wall_clock, "time with the wall clock instead of thread CPU time");
  app.add_option("--only", only, "comma-separated config names to run (e.g. int8/b128,int4/b128/zstd3)");
  CLI11_PARSE(app, argc, argv);
  try {
    nlohmann::json out;
    out["bench"] = "bench_codecs";
    out["threads"] = 1;
    out["timing"] = g_wall_clock ? "wall clock, best of reps" : "thread CPU time, best of reps";
    const auto x = synthetic_pseudo_gradient(mib * (1u << 20) / 4, seed);
    out["synthetic"] = bench_data("synthetic-student-t3-lognormal-rows", x, block, reps, only, zstd_levels);
    if (!real.empty()) {
      const auto r = read_real(real);
      out["real"] = bench_data(real, r, block, reps, only, zstd_levels);
    }
    // Targets from the issue, judged on the synthetic set (and the real one when given).
    nlohmann::json targets = nlohmann::json::array();
    for (const char* set : {"synthetic", "real"}) {
      if (!out.contains(set)) continue;
      for (const auto& row : out[set]["rows"]) {
        if (row["codec"] == "int8" && row["zstd_level"] == 0 && row["topk"] == 1.0)
          targets.push_back({{"set", set},
                             {"target", "int8 encode+decode >= 1 GB/s per core"},
                             {"geoloco", row["encode_decode_gbps"]},
                             {"goal", 1.0},
                             {"met", row["encode_decode_gbps"].get<double>() >= 1.0}});
        // One row per zstd level run (capture.sh uses level 1, the recommended one).
        if ((row["codec"] == "int4" || row["codec"] == "fp4") && row["zstd_level"].get<int>() > 0 && row["topk"] == 1.0)
          targets.push_back({{"set", set},
                             {"target", std::string(row["codec"]) + " + zstd " +
                                            std::to_string(row["zstd_level"].get<int>()) + " >= 8x smaller than fp32"},
                             {"geoloco", row["ratio_vs_fp32"]},
                             {"goal", 8.0},
                             {"met", row["ratio_vs_fp32"].get<double>() >= 8.0}});
      }
    }
    out["targets"] = targets;
    std::cout << out.dump(2) << "\n";
  } catch (const InputError& e) {
    std::cerr << "bench_codecs: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "bench_codecs: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

// The outer loop's round on a GPU rank, host path against device path (trainer/loop/device_outer.hpp):
// what a CUDA site spends from its shard on the device to the frame it sends, per round.
//   host    (outer.quantize_on: host): the fp32 shard down to pinned memory (HostStager), the
//           pseudo-gradient global - local, error feedback and quantization on the CPU
//           (compression::Pipeline::encode_with_residual, --threads), the frame;
//   device  (outer.quantize_on: device): CudaOuterStage::quantize (pseudo-gradient, correction,
//           codes, residual on the GPU; scales and codes down) and encode_staged.
// Both start from the same shard, global weights and zero residual and run the same rounds, so
// their frames must be identical bytes (checked every round: "frames_identical"). Rounds
// alternate host and device; the JSON gives the median of each, bytes copied to the host per
// round, the fp32 input rate (GB/s of shard per second) and the ratio host / device.
//
//   bench_outer_stage [--elements 67108864] [--codec int4] [--block 128] [--no-ef] [--zstd 0]
//                     [--threads 1] [--rounds 5] [--out f.json]
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "compression/pipeline.hpp"
#include "compression/synthetic.hpp"
#include "trainer/cuda/device.hpp"
#include "trainer/cuda/handles.hpp"
#include "trainer/cuda/staging.hpp"
#include "trainer/loop/cuda_outer_stage.hpp"

using namespace geoloco;
using Clock = std::chrono::steady_clock;

namespace {

std::vector<double> loadavg() {
  std::ifstream f("/proc/loadavg");
  double a = 0, b = 0, c = 0;
  f >> a >> b >> c;
  return {a, b, c};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"The outer loop's round on a GPU rank: fp32 staging and host quantization against device quantization"};
  size_t n = size_t{1} << 26;
  std::string codec = "int4";
  uint32_t block = 128;
  bool no_ef = false;
  int zstd = 0, threads = 1, rounds = 5;
  std::string out;
  app.add_option("--elements", n, "elements of the rank's shard")->check(CLI::Range(size_t{1}, size_t{1} << 32));
  app.add_option("--codec", codec, "int8 | int4 | fp4 | int2");
  app.add_option("--block", block, "elements per scale")->check(CLI::Range(8u, 1u << 20));
  app.add_flag("--no-ef", no_ef, "without error feedback");
  app.add_option("--zstd", zstd, "zstd level (0: off)")->check(CLI::Range(0, 19));
  app.add_option("--threads", threads, "host codec threads (outer.compression.threads)")->check(CLI::Range(1, 64));
  app.add_option("--rounds", rounds, "rounds of each path (alternated)")->check(CLI::Range(1, 1000));
  app.add_option("--out", out, "also write the JSON here");
  CLI11_PARSE(app, argc, argv);
  try {
    const auto load_before = loadavg();
    const cuda::DeviceInfo dev = cuda::select_device(0, 1);
    compression::PipelineConfig pc;
    const auto c = compression::codec_from_name(codec);
    if (!c || !compression::codec_has_scales(*c)) throw ConfigError("--codec: int8, int4, fp4 or int2, not " + codec);
    pc.codec = *c;
    pc.block = block;
    pc.error_feedback = !no_ef;
    pc.zstd_level = zstd;
    pc.threads = threads;
    compression::Pipeline host_pipe(pc), dev_pipe(pc);
    host_pipe.reserve(n);

    // The shard after H inner steps and the global weights it started from.
    const auto move = compression::synthetic_pseudo_gradient(n, 7);
    std::vector<float> global(n), local(n);
    for (size_t i = 0; i < n; ++i) {
      global[i] = 0.02f * static_cast<float>((i * 2654435761u) % 1000) / 1000.0f;
      local[i] = global[i] - move[i];
    }
    cuda::Stream stream("outer stage bench");
    cuda::DeviceBuffer<float> shard(n, "shard");
    cuda::check_cuda(cudaMemcpy(shard.data(), local.data(), n * 4, cudaMemcpyHostToDevice), "upload the shard");
    cuda::check_cuda(cudaDeviceSynchronize(), "upload the shard");
    trainer::CudaOuterStage stage([&] { return shard.span(); }, stream.get(), [] {});
    std::vector<float> zeros(pc.error_feedback ? n : 0, 0.0f);
    stage.define(0, {{0, static_cast<int64_t>(n)}}, global, zeros);
    cuda::HostStager mirror(n);
    std::vector<float> delta(n), residual(pc.error_feedback ? n : 0, 0.0f);

    std::vector<double> host_s, dev_s;
    uint64_t host_bytes = 0, dev_bytes = 0, frame_bytes = 0;
    bool identical = true;
    for (int r = 0; r < rounds; ++r) {
      std::vector<uint8_t> fh, fd;
      {
        const auto t0 = Clock::now();
        mirror.download_async(shard.span(), stream.get());
        const auto h = mirror.wait();
        for (size_t i = 0; i < n; ++i) delta[i] = global[i] - h[i];
        if (pc.error_feedback)
          host_pipe.encode_with_residual(delta, residual, fh);
        else
          host_pipe.encode(delta, nullptr, fh);
        host_s.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
        host_bytes = n * sizeof(float);
      }
      {
        const auto t0 = Clock::now();
        const auto st = stage.quantize(0, *c, block, 1.0f, {{0, n}});
        dev_pipe.encode_staged(st.slices[0].scales, st.slices[0].codes, n, fd);
        dev_s.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
        dev_bytes = st.host_bytes;
      }
      identical = identical && fh == fd;
      frame_bytes = fd.size();
    }
    const double th = median(host_s), td = median(dev_s);
    const double gb = double(n) * 4 / 1e9;
    nlohmann::json j = {{"bench", "outer_stage"},
                        {"device", dev.name},
                        {"elements", n},
                        {"codec", pc.describe()},
                        {"rounds", rounds},
                        {"frames_identical", identical},
                        {"frame_bytes", frame_bytes},
                        {"geoloco_device", {{"round_s", td}, {"host_bytes", dev_bytes}, {"input_gb_s", gb / td}}},
                        {"peer_host_staging",
                         {{"round_s", th}, {"host_bytes", host_bytes}, {"input_gb_s", gb / th}, {"threads", threads}}},
                        {"ratio_host_over_device", td > 0 ? th / td : 0.0},
                        {"host_bytes_ratio", host_bytes ? double(dev_bytes) / double(host_bytes) : 0.0},
                        {"load_before", load_before},
                        {"load_after", loadavg()}};
    std::cout << j.dump(2) << "\n";
    if (!out.empty()) std::ofstream(out) << j.dump(2) << "\n";
    return identical ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "bench_outer_stage: " << e.what() << "\n";
    return 1;
  }
}

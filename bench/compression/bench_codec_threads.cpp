// bench_codec_threads: the codec on several threads (outer.compression.threads) against one
// thread (the peer), in wall-clock GB/s of fp32 input per rank, and whether it keeps up with a
// rank's share of the WAN link: the frames it emits per second over the link's bytes per
// second per rank (goal >= 10x: encoding a shard takes a tenth of sending it, or less).
//
// Both readings of "keeps up" are printed: input_vs_link_x, fp32 input GB/s over the link
// share (the time to encode a shard against the time the link takes for the same bytes
// uncompressed), and keeps_up_x, frames out per second over the link share.
//
// Per config (int8 + zstd 1, int4 + error feedback + zstd 3, int2 + error feedback + zstd 3, by
// default) and thread count: encode (with error feedback where the config has it) and decode
// of --mib MiB of synthetic pseudo-gradients, thread counts alternated in every repetition,
// the median of --reps (at least 5) with min and max. Frames are checked byte-identical
// across thread counts. Refuses to start above load average 1.0 unless --allow-load (then
// "loaded": true); records the load average before and after. Prints one JSON document.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "compression/pipeline.hpp"
#include "compression/synthetic.hpp"
#include "core/error.hpp"

using namespace geoloco;
using namespace geoloco::compression;
using Clock = std::chrono::steady_clock;

namespace {

std::vector<double> loadavg() {
  std::ifstream f("/proc/loadavg");
  std::vector<double> v(3, 0.0);
  f >> v[0] >> v[1] >> v[2];
  return v;
}

nlohmann::json spread(std::vector<double> xs) {
  std::vector<double> s = xs;
  std::sort(s.begin(), s.end());
  const double med = s.size() % 2 ? s[s.size() / 2] : 0.5 * (s[s.size() / 2 - 1] + s[s.size() / 2]);
  return {{"median", med}, {"min", s.front()}, {"max", s.back()}, {"all", xs}};
}

PipelineConfig parse(const std::string& name, int threads) {
  // "int4/top0.1/ef/zstd3": codec, optional topF, ef, zstdN (block 128).
  PipelineConfig c;
  std::stringstream ss(name);
  std::string part;
  bool first = true;
  while (std::getline(ss, part, '/')) {
    if (first) {
      const auto codec = codec_from_name(part);
      if (!codec) throw InputError("--configs: unknown codec '" + part + "' in '" + name + "'");
      c.codec = *codec;
      first = false;
    } else if (part == "ef") {
      c.error_feedback = true;
    } else if (part.rfind("top", 0) == 0 && part.size() > 3) {
      c.topk = std::stod(part.substr(3));
    } else if (part.rfind("zstd", 0) == 0 && part.size() > 4) {
      c.zstd_level = std::stoi(part.substr(4));
    } else {
      throw InputError("--configs: '" + part + "' in '" + name + "' (expected topF, ef or zstdN)");
    }
  }
  c.threads = threads;
  c.validate();
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("bench_codec_threads: codec GB/s on several threads vs one, against a rank's link share");
  size_t mib = 64;
  int reps = 5;
  std::vector<int> threads = {1, 2};
  std::vector<std::string> configs = {"int8/zstd1", "int4/ef/zstd3", "int2/ef/zstd3"};
  double link_gbit = 10;
  int ranks_per_link = 8;
  bool allow_load = false;
  app.add_option("--mib", mib, "fp32 MiB per frame (a rank's shard)")->check(CLI::Range(1, 4096));
  app.add_option("--reps", reps, "repetitions (median; at least 5)")->check(CLI::Range(5, 100));
  app.add_option("--threads", threads, "thread counts; the first is the peer")->delimiter(',');
  app.add_option("--configs", configs, "codec/ef/zstdN configs")->delimiter(',');
  app.add_option("--link-gbit", link_gbit, "the site's WAN link, Gbit/s")->check(CLI::PositiveNumber);
  app.add_option("--ranks-per-link", ranks_per_link, "ranks sharing it")->check(CLI::Range(1, 100000));
  app.add_flag("--allow-load", allow_load, "run even above load average 1.0 (the JSON says loaded)");
  CLI11_PARSE(app, argc, argv);
  try {
    const auto before = loadavg();
    if (before[0] > 1.0 && !allow_load) {
      std::cerr << "bench_codec_threads: load average " << before[0]
                << " is above 1.0: figures now measure the other work (pass --allow-load to run anyway)\n";
      return 3;
    }
    const auto x = synthetic_pseudo_gradient(mib * (1u << 20) / 4, 1);
    const double gb = x.size() * 4.0 / 1e9;
    const double share_gbps = link_gbit / 8.0 / ranks_per_link;
    nlohmann::json rows = nlohmann::json::array();
    for (const auto& name : configs) {
      std::vector<std::unique_ptr<Pipeline>> ps;
      std::vector<std::vector<double>> enc(threads.size()), dec(threads.size());
      std::vector<std::vector<uint8_t>> frames(threads.size());
      std::vector<std::vector<float>> residual(threads.size());
      for (int t : threads) ps.push_back(std::make_unique<Pipeline>(parse(name, t)));
      std::vector<float> y(x.size());
      for (int r = 0; r < reps; ++r)
        for (size_t i = 0; i < threads.size(); ++i) {  // thread counts alternated
          auto& p = *ps[i];
          residual[i].assign(x.size(), 0.0f);
          auto t0 = Clock::now();
          if (p.config().error_feedback)
            p.encode_with_residual(x, residual[i], frames[i]);
          else
            p.encode(x, nullptr, frames[i]);
          enc[i].push_back(gb / std::chrono::duration<double>(Clock::now() - t0).count());
          t0 = Clock::now();
          p.decode(frames[i], x.size(), y);
          dec[i].push_back(gb / std::chrono::duration<double>(Clock::now() - t0).count());
        }
      for (size_t i = 1; i < threads.size(); ++i)
        if (frames[i] != frames[0])
          throw Error("frames differ between " + std::to_string(threads[0]) + " and " + std::to_string(threads[i]) +
                      " threads (" + name + ")");
      const double ratio = 4.0 * double(x.size()) / double(frames[0].size());
      for (size_t i = 0; i < threads.size(); ++i) {
        const auto e = spread(enc[i]), d = spread(dec[i]);
        const double frame_gbps = e["median"].get<double>() / ratio;
        rows.push_back({{"config", name},
                        {"threads", threads[i]},
                        {"encode_gbps", e},
                        {"decode_gbps", d},
                        {"ratio_vs_fp32", ratio},
                        {"frame_out_gbps", frame_gbps},
                        {"link_share_gbps", share_gbps},
                        {"input_vs_link_x", e["median"].get<double>() / share_gbps},
                        {"keeps_up_x", frame_gbps / share_gbps},
                        {"encode_vs_one_thread", e["median"].get<double>() / spread(enc[0])["median"].get<double>()}});
        std::cerr << rows.back().dump() << "\n";
      }
    }
    nlohmann::json out = {{"bench", "bench_codec_threads"},
                          {"timing", "wall clock, median of reps, thread counts alternated"},
                          {"mib", mib},
                          {"peer", "the same codec on " + std::to_string(threads.front()) + " thread(s)"},
                          {"link", {{"gbit", link_gbit}, {"ranks", ranks_per_link}, {"share_gbps", share_gbps}}},
                          {"goal_keeps_up_x", 10},
                          {"rows", rows},
                          {"load_before", before},
                          {"load_after", loadavg()},
                          {"max_load", 1.0},
                          {"loaded", before[0] > 1.0},
                          {"runs", reps},
                          {"nproc", std::thread::hardware_concurrency()}};
    std::cout << out.dump(2) << "\n";
  } catch (const InputError& e) {
    std::cerr << "bench_codec_threads: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "bench_codec_threads: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

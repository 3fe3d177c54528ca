// The training loop on the GPU (site.device: cuda), end to end through trainer::Trainer and
// app::run_rank: a 2-rank site whose loss curve tracks the CPU run of the same config, the
// strategies' equivalences on the device, bit-exact resume, and a 2-site DiLoCo run whose
// sites end bit-identical. Ranks are threads. Every test skips with the CUDA runtime's reason
// when no GPU is usable.
//
// One GPU is enough: 2-rank sites share device 0 through ThreadDeviceCollective (NCCL refuses
// two ranks of one communicator on one device); NCCL inside the loop runs on one GPU through
// 1-rank sites given a real 1-rank communicator; the 2-rank NCCL site runs only with >= 2 GPUs.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include <fstream>

#include "tests/trainer/loop/test_util.hpp"
#include "tests/support/ports.hpp"
#include "tests/support/threads.hpp"
#include "gpu_test_util.hpp"
#include "thread_device_collective.hpp"
#include "trainer/app/rank_runner.hpp"
#include "trainer/cuda/device.hpp"
#include "trainer/cuda/tolerance.hpp"
#include "trainer/loop/run_config.hpp"
#include "trainer/loop/trainer.hpp"
#include "trainer/parallel/gloo_collective.hpp"
#include "trainer/parallel/nccl_collective.hpp"

namespace geoloco::cuda::testing {
namespace {

using geoloco::test::fresh_port;
using geoloco::test::TempDir;

#define REQUIRE_GPU_OR_SKIP()                                                          \
  do {                                                                                 \
    const std::string why_ = ::geoloco::cuda::no_device_reason();                      \
    if (!why_.empty()) GTEST_SKIP() << "no usable GPU, device test skipped: " << why_; \
  } while (0)

// NCCL needs a real GPU: on the CUDA emulator (test_cuda_loop_emulated) those tests skip.
#if defined(GEOLOCO_CUDA_EMULATOR)
#define REQUIRE_NCCL_DEVICE_OR_SKIP() GTEST_SKIP() << "needs a real GPU: NCCL is not part of the CUDA emulator"
#else
#define REQUIRE_NCCL_DEVICE_OR_SKIP() REQUIRE_GPU_OR_SKIP()
#endif

// 2 layers, 64 wide, context 32: small enough for seconds, large enough for real GEMMs.
std::string config(const std::filesystem::path& out, const std::string& device, const std::string& precision,
                   const std::string& strategy, int ranks, int steps, const std::string& extra_train = "") {
  return "run: {name: g, seed: 17, output_dir: " + out.string() +
         "}\n"
         "model: {n_layer: 2, n_head: 4, n_embd: 64, block_size: 32, vocab_size: 64}\n"
         "data:\n  train: {kind: synthetic, vocab: 64, branching: 3, seed: 5, tokens: 400000}\n"
         "train:\n  steps: " +
         std::to_string(steps) +
         "\n  micro_batch: 4\n  grad_accum: 2\n  log_every: 1\n"
         "  precision: " +
         precision + "\n  optimizer: {lr: 3.0e-3}\n  schedule: {kind: cosine, warmup_steps: 3}\n" + extra_train +
         "sites: [{name: s, ranks: " + std::to_string(ranks) + ", port: " + std::to_string(fresh_port()) +
         ", strategy: " + strategy + ", device: " + device + "}]\n";
}

trainer::RunConfig load(TempDir& d, const std::string& name, const std::string& yaml,
                        const std::vector<std::string>& sets = {}) {
  return trainer::load_run_config(d.file(name, yaml), sets);
}

// One site, ranks as threads. GPU: device 0 shared through ThreadDeviceCollective; CPU: Gloo.
std::vector<nlohmann::json> run_site(const trainer::RunConfig& cfg, int64_t stop_at = 0, bool resume = false) {
  const auto& sc = cfg.sites.at(0);
  const int R = sc.ranks;
  const bool gpu = sc.device == "cuda";
  auto board = std::make_shared<ThreadBoard>(R);
  return test::run_ranks(R, [&](int r) {
    std::unique_ptr<parallel::Collective> coll;
    if (gpu) check_cuda(cudaSetDevice(0), "cudaSetDevice(0)");
    if (R > 1) {
      if (gpu) {
        coll = std::make_unique<ThreadDeviceCollective>(board, r, sc.name);
      } else {
        parallel::RendezvousOptions ro;
        ro.site = sc.name;
        ro.rank = r;
        ro.size = R;
        ro.store_port = sc.port + R;
        coll = parallel::make_gloo(ro);
      }
    }
    trainer::TrainerOptions o;
    o.rank = r;
    o.collective = coll.get();
    o.progress = false;
    o.stop_at_step = stop_at;
    o.resume = resume;
    o.cuda_device = gpu ? 0 : -1;
    trainer::Trainer t(cfg, o);
    return t.run();
  });
}

// The site's per-step training loss from sites/<site>/metrics.jsonl (log_every: 1).
std::vector<float> loss_curve(const trainer::RunConfig& cfg) {
  std::ifstream in(std::filesystem::path(cfg.run.output_dir) / "sites" / cfg.sites[0].name / "metrics.jsonl");
  std::vector<float> c;
  std::string line;
  while (std::getline(in, line)) c.push_back(nlohmann::json::parse(line)["loss"].get<float>());
  return c;
}

std::string hash_of(const nlohmann::json& summary) { return summary["params_hash"].get<std::string>(); }

class CudaLoop : public ::testing::TestWithParam<Precision> {};

TEST_P(CudaLoop, TwoRankSiteTracksTheCpuRun) {
  REQUIRE_GPU_OR_SKIP();
  const Precision p = GetParam();
  const std::string prec = p == Precision::Bf16 ? "bf16" : "fp32";
  TempDir d;
  auto gcfg = load(d, "g.yaml", config(d.path() / "gpu", "cuda", prec, "ddp", 2, 20));
  auto ccfg = load(d, "c.yaml", config(d.path() / "cpu", "cpu", "fp32", "ddp", 2, 20));
  auto g = run_site(gcfg);
  run_site(ccfg);
  const auto gc = loss_curve(gcfg), cc = loss_curve(ccfg);
  ASSERT_EQ(gc.size(), 20u);
  ASSERT_EQ(cc.size(), 20u);
  const ErrorStats s = compare(gc, cc);
  std::string curves;
  for (size_t i = 0; i < gc.size(); ++i) curves += fmt::format(" {:.4f}/{:.4f}", gc[i], cc[i]);
  std::printf("[loop parity] %s ddp 2 ranks: loss curve rel L2 %.3g (tolerance %.3g)\n", prec.c_str(), s.rel_l2,
              tolerance("train.loss", p));
  EXPECT_TRUE(within(s, tolerance("train.loss", p))) << "rel L2 " << s.rel_l2 << " gpu/cpu:" << curves;
  EXPECT_LT(gc.back(), gc.front() * 0.9f) << curves;
  // Both ranks end with the same parameters; the summary says where it ran.
  EXPECT_EQ(hash_of(g[0]), hash_of(g[1]));
  EXPECT_EQ(g[0]["device"]["precision"], prec);
  EXPECT_EQ(g[0]["device"]["grad_overlap"], true);
}

INSTANTIATE_TEST_SUITE_P(Precisions, CudaLoop, ::testing::Values(Precision::Fp32, Precision::Bf16),
                         [](const auto& info) { return info.param == Precision::Bf16 ? "bf16" : "fp32"; });

// zero1 == ddp bit for bit (same reduced gradient, same norm, AdamW elementwise on a shard);
// zero2 and fsdp too when clipping is off (the norm is the only thing summed differently).
TEST(CudaLoopStrategies, Zero1EqualsDdpAndShardedEqualWithoutClipping) {
  REQUIRE_GPU_OR_SKIP();
  TempDir d;
  std::map<std::string, std::string> clipped, unclipped;
  for (const char* s : {"ddp", "zero1"}) {
    auto cfg = load(d, std::string(s) + ".yaml", config(d.path() / s, "cuda", "fp32", s, 2, 5));
    auto out = run_site(cfg);
    EXPECT_EQ(hash_of(out[0]), hash_of(out[1])) << s;
    clipped[s] = hash_of(out[0]);
  }
  EXPECT_EQ(clipped["ddp"], clipped["zero1"]);
  for (const char* s : {"ddp", "zero2", "fsdp"}) {
    auto cfg = load(d, std::string(s) + "-nc.yaml",
                    config(d.path() / (std::string(s) + "-nc"), "cuda", "fp32", s, 2, 5, "  grad_clip: 0\n"));
    unclipped[s] = hash_of(run_site(cfg)[0]);
  }
  EXPECT_EQ(unclipped["ddp"], unclipped["zero2"]);
  EXPECT_EQ(unclipped["ddp"], unclipped["fsdp"]);
}

// Muon (train.optimizer.kind: muon) on the device: a 2-rank sharded site all-gathers the
// matrices' momentum updates on device buffers, so zero1, zero2 and fsdp end on ddp's bits
// (clipping off); and the GPU run's loss curve tracks the CPU's Muon run.
TEST(CudaLoopStrategies, MuonShardedEqualsDdpAndTracksTheCpuRun) {
  REQUIRE_GPU_OR_SKIP();
  TempDir d;
  const std::vector<std::string> muon = {"train.optimizer.kind=muon", "train.grad_clip=0"};
  std::map<std::string, std::string> hashes;
  for (const char* s : {"ddp", "zero1", "zero2", "fsdp"}) {
    auto cfg = load(d, std::string(s) + ".yaml", config(d.path() / s, "cuda", "fp32", s, 2, 4), muon);
    auto out = run_site(cfg);
    EXPECT_EQ(hash_of(out[0]), hash_of(out[1])) << s;
    EXPECT_EQ(out[0]["memory"]["optimizer"], "muon") << s;
    hashes[s] = hash_of(out[0]);
  }
  EXPECT_EQ(hashes["ddp"], hashes["zero1"]);
  EXPECT_EQ(hashes["ddp"], hashes["zero2"]);
  EXPECT_EQ(hashes["ddp"], hashes["fsdp"]);
  auto gcfg = load(d, "g.yaml", config(d.path() / "gpu", "cuda", "fp32", "ddp", 2, 10), muon);
  auto ccfg = load(d, "c.yaml", config(d.path() / "cpu", "cpu", "fp32", "ddp", 2, 10), muon);
  run_site(gcfg);
  run_site(ccfg);
  const auto gc = loss_curve(gcfg), cc = loss_curve(ccfg);
  ASSERT_EQ(gc.size(), 10u);
  const ErrorStats s = compare(gc, cc);
  std::printf("[loop parity] muon ddp 2 ranks: loss curve rel L2 %.3g (tolerance %.3g)\n", s.rel_l2,
              tolerance("train.loss", Precision::Fp32));
  EXPECT_TRUE(within(s, tolerance("train.loss", Precision::Fp32))) << "rel L2 " << s.rel_l2;
  EXPECT_LT(gc.back(), gc.front() * 0.9f);
}

// Stop after 3 steps, resume to 6: the same bits as 6 steps in one go (params and loss).
TEST(CudaLoopStrategies, ResumeIsBitExact) {
  REQUIRE_GPU_OR_SKIP();
  for (auto [strategy, ranks, prec] : std::vector<std::tuple<std::string, int, std::string>>{
           {"ddp", 1, "bf16"}, {"zero1", 2, "fp32"}, {"fsdp", 2, "bf16"}}) {
    TempDir d;
    auto full = load(d, "a.yaml", config(d.path() / "a", "cuda", prec, strategy, ranks, 6));
    auto split = load(d, "b.yaml", config(d.path() / "b", "cuda", prec, strategy, ranks, 6));
    auto want = run_site(full);
    run_site(split, 3);
    auto got = run_site(split, 0, true);
    EXPECT_EQ(hash_of(got[0]), hash_of(want[0])) << strategy << " " << prec;
    EXPECT_EQ(loss_curve(split), loss_curve(full)) << strategy << " " << prec;
  }
}

// hybrid on device buffers, 4 ranks (subgroups split from the thread collective): one group of
// 4 is fsdp bit for bit; two groups of 2 train fsdp's model up to the order of the gradient's
// sums (group, then replica set), every rank on the same bits; stopped at step 2 and resumed,
// the same bits as 4 steps in one go.
TEST(CudaLoopStrategies, HybridIsFsdpWithOneGroupTracksItWithTwoAndResumesExactly) {
  REQUIRE_GPU_OR_SKIP();
  TempDir d;
  auto fsdp = load(d, "f.yaml", config(d.path() / "f", "cuda", "fp32", "fsdp", 4, 4));
  auto one = load(d, "h4.yaml", config(d.path() / "h4", "cuda", "fp32", "hybrid, group_size: 4", 4, 4));
  auto two = load(d, "h2.yaml", config(d.path() / "h2", "cuda", "fp32", "hybrid, group_size: 2", 4, 4));
  auto split = load(d, "h2s.yaml", config(d.path() / "h2s", "cuda", "fp32", "hybrid, group_size: 2", 4, 4));
  const auto f = run_site(fsdp);
  EXPECT_EQ(hash_of(run_site(one)[0]), hash_of(f[0]));
  const auto h = run_site(two);
  for (int r = 1; r < 4; ++r) EXPECT_EQ(hash_of(h[size_t(r)]), hash_of(h[0])) << r;
  EXPECT_EQ(h[0]["memory"]["group_size"], 2);
  const auto hc = loss_curve(two), fc = loss_curve(fsdp);
  ASSERT_EQ(hc.size(), 4u);
  for (size_t i = 0; i < hc.size(); ++i) EXPECT_NEAR(hc[i], fc[i], 1e-5 * std::fabs(fc[i])) << "step " << i;
  run_site(split, 2);
  EXPECT_EQ(hash_of(run_site(split, 0, true)[0]), hash_of(h[0]));
  EXPECT_EQ(loss_curve(split), hc);
}

// Muon under hybrid on the device: the sharded step gathers the matrices' updates through the
// replica set and the group (device buffers); two groups of 2 track fsdp's Muon run.
TEST(CudaLoopStrategies, HybridMuonTracksFsdp) {
  REQUIRE_GPU_OR_SKIP();
  TempDir d;
  const std::vector<std::string> muon = {"train.optimizer.kind=muon", "train.grad_clip=0"};
  auto fsdp = load(d, "f.yaml", config(d.path() / "f", "cuda", "fp32", "fsdp", 4, 4), muon);
  auto two = load(d, "h.yaml", config(d.path() / "h", "cuda", "fp32", "hybrid, group_size: 2", 4, 4), muon);
  run_site(fsdp);
  const auto h = run_site(two);
  EXPECT_EQ(h[0]["memory"]["optimizer"], "muon");
  for (int r = 1; r < 4; ++r) EXPECT_EQ(hash_of(h[size_t(r)]), hash_of(h[0])) << r;
  const auto hc = loss_curve(two), fc = loss_curve(fsdp);
  ASSERT_EQ(hc.size(), 4u);
  for (size_t i = 0; i < hc.size(); ++i) EXPECT_NEAR(hc[i], fc[i], 1e-5 * std::fabs(fc[i])) << "step " << i;
}

// Two sites of one rank each on the GPU, DiLoCo every 4 steps over UCX on loopback: both
// sites end with the same bits (the outer loop stages shards through the pinned mirror).
TEST(CudaLoopDiloco, TwoSitesEndBitIdentical) {
  REQUIRE_GPU_OR_SKIP();
  TempDir d;
  d.file("k.psk", "0123456789abcdef-test-key");
  const int port = fresh_port();
  const std::string yaml =
      "run: {name: dl, seed: 3, output_dir: " + (d.path() / "out").string() +
      "}\n"
      "model: {n_layer: 2, n_head: 4, n_embd: 64, block_size: 32, vocab_size: 64}\n"
      "data:\n  train: {kind: synthetic, vocab: 64, branching: 3, seed: 5, tokens: 400000}\n"
      "train: {steps: 12, micro_batch: 4, log_every: 4, precision: bf16, optimizer: {lr: 3.0e-3}}\n"
      "outer: {interval: 4}\n"
      "site: {device: cuda}\n"
      "sites:\n  - {name: paris, ranks: 1, port: " +
      std::to_string(port) +
      "}\n"
      "  - {name: lyon, ranks: 1, port: " +
      std::to_string(port + 10) +
      "}\n"
      "transport: {psk_file: k.psk, timeout_s: 30}\n";
  auto cfg = load(d, "c.yaml", yaml);
  test::run_ranks(2, [&](int s) {
    app::RankOptions o;
    o.site = s;
    o.progress = false;
    o.cuda_device = 0;  // one GPU shared by the two sites
    return app::run_rank(cfg, o);
  });
  // Global rank 0 returns the run summary; every rank's own summary is in rank0.json.
  auto rank_summary = [&](const char* site) {
    return nlohmann::json::parse(std::ifstream(d.path() / "out" / "sites" / site / "rank0.json"));
  };
  const auto a = rank_summary("paris"), b = rank_summary("lyon");
  EXPECT_EQ(hash_of(a), hash_of(b));
  EXPECT_EQ(a["steps"], 12);
  EXPECT_EQ(a["device"]["precision"], "bf16");
}

// Sites of different sizes and devices (docs/shapes.md): a 1-rank GPU site and a 2-rank CPU
// site. The GPU site's shard is cut into two pieces, each staged, encoded and exchanged with
// the CPU rank that owns it; both sites end every round on the same global weights (the outer
// loop's arithmetic is on the host whatever the device).
TEST(CudaLoopDiloco, AOneRankGpuSiteAndATwoRankCpuSiteEndBitIdentical) {
  REQUIRE_GPU_OR_SKIP();
  TempDir d;
  d.file("k.psk", "0123456789abcdef-test-key");
  const int port = fresh_port();
  const std::string yaml = "run: {name: dl, seed: 3, output_dir: " + (d.path() / "out").string() +
                           "}\n"
                           "model: {n_layer: 2, n_head: 4, n_embd: 64, block_size: 32, vocab_size: 64}\n"
                           "data:\n  train: {kind: synthetic, vocab: 64, branching: 3, seed: 5, tokens: 400000}\n"
                           "train: {steps: 8, micro_batch: 4, log_every: 4, optimizer: {lr: 3.0e-3}}\n"
                           "outer: {interval: 4, compression: {codec: int4, block: 64, error_feedback: true}}\n"
                           "sites:\n  - {name: paris, ranks: 1, device: cuda, port: " +
                           std::to_string(port) +
                           "}\n"
                           "  - {name: lyon, ranks: 2, port: " +
                           std::to_string(port + 10) +
                           "}\n"
                           "transport: {psk_file: k.psk, timeout_s: 30}\n";
  auto cfg = load(d, "c.yaml", yaml);
  test::run_ranks(3, [&](int g) {
    app::RankOptions o;
    o.site = g == 0 ? 0 : 1;
    o.rank = g == 0 ? 0 : g - 1;
    o.progress = false;
    if (g == 0) o.cuda_device = 0;
    return app::run_rank(cfg, o);
  });
  std::set<std::string> hashes;
  for (const char* f : {"paris/rank0.json", "lyon/rank0.json", "lyon/rank1.json"}) {
    const auto j = nlohmann::json::parse(std::ifstream(d.path() / "out" / "sites" / f));
    hashes.insert(j["global_weights_hash"].get<std::string>());
    EXPECT_EQ(j["outer_steps"], 2) << f;
  }
  EXPECT_EQ(hashes.size(), 1u);
}

// outer.quantize_on: device (trainer/loop/device_outer.hpp): a GPU site's pseudo-gradient is
// computed, corrected by its residual and quantized on the device, and only scales and codes
// come to the host. The kernels make the CPU codec's bytes, so a run must end on the bits of
// the same run quantized on the host -- the GPU site's parameters, every site's global
// weights, every round's frame bytes -- while the snapshots copy a fraction of the fp32 shard.
// A 1-rank GPU site beside a 2-rank CPU site (two segments on the GPU rank), by schedule:
// blocking int4 + error feedback; two fragments overlapped with int8, a decaying residual and
// the merge on the device; the owner exchange (slices) with fp4 and int2 over three sites.
struct DeviceQuantizeCase {
  const char* name;
  std::string outer;  // the outer section's body
  int cpu_sites = 1;  // 2-rank CPU sites beside the GPU site
  int steps = 8;
};

// (gtest prints the case by its name, not its bytes, in test listings)
void PrintTo(const DeviceQuantizeCase& c, std::ostream* os) { *os << c.name; }

class CudaLoopDeviceQuantize : public ::testing::TestWithParam<DeviceQuantizeCase> {};

std::string device_quantize_yaml(const std::filesystem::path& out, const DeviceQuantizeCase& c, int port,
                                 const std::string& quantize_on, const std::string& extra_train = "") {
  std::string yaml = "run: {name: dq, seed: 3, output_dir: " + out.string() +
                     "}\n"
                     "model: {n_layer: 2, n_head: 4, n_embd: 64, block_size: 32, vocab_size: 64}\n"
                     "data:\n  train: {kind: synthetic, vocab: 64, branching: 3, seed: 5, tokens: 400000}\n"
                     "train: {steps: " +
                     std::to_string(c.steps) + ", micro_batch: 4, log_every: 4, optimizer: {lr: 3.0e-3}" + extra_train +
                     "}\n"
                     "outer: {" +
                     c.outer + ", quantize_on: " + quantize_on +
                     "}\n"
                     "sites:\n  - {name: paris, ranks: 1, device: cuda, port: " +
                     std::to_string(port) + "}\n";
  for (int i = 0; i < c.cpu_sites; ++i)
    yaml += "  - {name: cpu" + std::to_string(i) + ", ranks: 2, port: " + std::to_string(port + 10 * (i + 1)) + "}\n";
  return yaml + "transport: {psk_file: k.psk, timeout_s: 30}\n";
}

// Runs every rank of the case's sites (GPU rank first) as threads.
void run_device_quantize(const trainer::RunConfig& cfg, int cpu_sites, int64_t stop_at = 0, bool resume = false) {
  test::run_ranks(1 + 2 * cpu_sites, [&](int g) {
    app::RankOptions o;
    o.site = g == 0 ? 0 : 1 + (g - 1) / 2;
    o.rank = g == 0 ? 0 : (g - 1) % 2;
    o.progress = false;
    o.stop_at_step = stop_at;
    o.resume = resume;
    if (g == 0) o.cuda_device = 0;
    return app::run_rank(cfg, o);
  });
}

struct DeviceQuantizeRun {
  nlohmann::json gpu;                      // paris/rank0.json
  std::set<std::string> global_hashes;     // over every rank
  std::vector<nlohmann::json> gpu_rounds;  // paris' rounds.r0.jsonl
};

DeviceQuantizeRun read_device_quantize(const std::filesystem::path& out, int cpu_sites) {
  DeviceQuantizeRun r;
  auto rank_json = [&](const std::string& f) { return nlohmann::json::parse(std::ifstream(out / "sites" / f)); };
  r.gpu = rank_json("paris/rank0.json");
  r.global_hashes.insert(r.gpu["global_weights_hash"].get<std::string>());
  for (int i = 0; i < cpu_sites; ++i)
    for (int k = 0; k < 2; ++k)
      r.global_hashes.insert(
          rank_json(fmt::format("cpu{}/rank{}.json", i, k))["global_weights_hash"].get<std::string>());
  std::ifstream in(out / "sites" / "paris" / "rounds.r0.jsonl");
  std::string line;
  while (std::getline(in, line)) r.gpu_rounds.push_back(nlohmann::json::parse(line));
  return r;
}

TEST_P(CudaLoopDeviceQuantize, EndsOnTheBitsOfTheHostPathCopyingAFractionOfTheShard) {
  REQUIRE_GPU_OR_SKIP();
  const DeviceQuantizeCase& c = GetParam();
  std::map<std::string, DeviceQuantizeRun> runs;
  for (const std::string on : {"host", "device"}) {
    TempDir d;
    d.file("k.psk", "0123456789abcdef-test-key");
    auto cfg = load(d, "c.yaml", device_quantize_yaml(d.path() / "out", c, fresh_port(), on));
    run_device_quantize(cfg, c.cpu_sites);
    runs[on] = read_device_quantize(d.path() / "out", c.cpu_sites);
  }
  const auto& h = runs["host"];
  const auto& g = runs["device"];
  EXPECT_EQ(h.global_hashes.size(), 1u);
  EXPECT_EQ(g.global_hashes, h.global_hashes) << "the device's frames are not the host's";
  EXPECT_EQ(hash_of(g.gpu), hash_of(h.gpu));
  EXPECT_EQ(h.gpu["outer_quantize_on"], "host");
  EXPECT_EQ(g.gpu["outer_quantize_on"], "device");
  // The snapshots' copies: the whole fp32 part on the host path, scales and codes (and 1.5 KiB
  // of error sums per frame) on the device's.
  const double fp32 = g.gpu["snapshot_fp32_bytes"].get<double>();
  EXPECT_EQ(h.gpu["snapshot_host_bytes"].get<double>(), fp32);
  EXPECT_EQ(h.gpu["snapshot_fp32_bytes"].get<double>(), fp32);
  EXPECT_GT(fp32, 0);
  const double frames = g.gpu["snapshot_host_bytes"].get<double>();
  EXPECT_LT(frames, 0.4 * fp32) << "device snapshot copied " << frames << " of " << fp32;
  EXPECT_GT(g.gpu["outer_memory"]["device_bytes"].get<double>(), 0);
  // No fp32 snapshot on the host: its round buffers are 8 B per element of a fragment in
  // flight instead of 12 (decoded frame and average, no snapshot).
  const double host_round = h.gpu["outer_memory"]["round_bytes_per_param"].get<double>();
  EXPECT_GT(host_round, 0);
  EXPECT_NEAR(g.gpu["outer_memory"]["round_bytes_per_param"].get<double>(), host_round * 8 / 12, 0.01 * host_round);
  EXPECT_EQ(h.gpu["outer_memory"]["device_bytes"].get<double>(), 0);
  // Round by round: the same frames, and the same error figures up to summation order.
  ASSERT_EQ(g.gpu_rounds.size(), h.gpu_rounds.size());
  ASSERT_GT(g.gpu_rounds.size(), 0u);
  for (size_t i = 0; i < g.gpu_rounds.size(); ++i) {
    EXPECT_EQ(g.gpu_rounds[i]["frame_bytes"], h.gpu_rounds[i]["frame_bytes"]) << "round " << i;
    EXPECT_EQ(g.gpu_rounds[i]["global_hash"], h.gpu_rounds[i]["global_hash"]) << "round " << i;
    const double he = h.gpu_rounds[i]["err2"].get<double>(), ge = g.gpu_rounds[i]["err2"].get<double>();
    const double hr = h.gpu_rounds[i]["ref2"].get<double>(), gr = g.gpu_rounds[i]["ref2"].get<double>();
    EXPECT_GT(hr, 0) << "round " << i;
    EXPECT_NEAR(ge, he, 1e-9 * hr + 1e-6 * he) << "round " << i;
    EXPECT_NEAR(gr, hr, 1e-6 * hr) << "round " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Schedules, CudaLoopDeviceQuantize,
    ::testing::Values(
        DeviceQuantizeCase{"BlockingInt4WithErrorFeedback",
                           "interval: 4, compression: {codec: int4, block: 64, error_feedback: true}"},
        DeviceQuantizeCase{"TwoFragmentsOverlappedInt8DecayingResidual",
                           "interval: 4, fragments: 2, overlap_steps: 1, merge_alpha: 0.5, compression: {codec: "
                           "int8, block: 32, error_feedback: true, error_feedback_decay: 0.9, zstd_level: 1}",
                           1, 12},
        DeviceQuantizeCase{"OwnerExchangeFp4ThreeSites",
                           "interval: 4, exchange: owner, min_sites: 3, compression: {codec: fp4, block: 48, "
                           "error_feedback: true}",
                           2},
        DeviceQuantizeCase{"Int2WithoutErrorFeedback", "interval: 4, compression: {codec: int2, block: 128}"}),
    [](const auto& info) { return std::string(info.param.name); });

// Under plan: auto the fragments are rebuilt at the start-up plan and at re-plans (the drift
// hook makes the link look 1000x slower after step 12; the 0.999 target makes any such change a new plan): each time the device side is cleared
// and every fragment defined again with the state carried over (global weights, residual),
// and the run still ends on one hash, quantized on the device throughout.
TEST(CudaLoopDeviceQuantize, PlansRebuildTheDeviceFragmentsAndTheSitesStayOnOneHash) {
  REQUIRE_GPU_OR_SKIP();
  const DeviceQuantizeCase c{"plan",
                             "interval: 4, plan: auto, plan_measure_steps: 4, plan_probe_seconds: 0.1, "
                             "plan_h_min: 4, plan_h_max: 40, target_utilization: 0.999, replan_threshold: 0.5, "
                             "plan_bits: [8, 4], compression: {codec: int8, block: 64, error_feedback: true}",
                             1, 48};
  TempDir d;
  d.file("k.psk", "0123456789abcdef-test-key");
  auto cfg = load(d, "c.yaml", device_quantize_yaml(d.path() / "out", c, fresh_port(), "device"));
  test::run_ranks(3, [&](int g) {
    app::RankOptions o;
    o.site = g == 0 ? 0 : 1;
    o.rank = g == 0 ? 0 : g - 1;
    o.progress = false;
    o.outer_hooks.drift = outer::OuterHooks::Drift{12, 1000};
    if (g == 0) o.cuda_device = 0;
    return app::run_rank(cfg, o);
  });
  const auto r = read_device_quantize(d.path() / "out", c.cpu_sites);
  EXPECT_EQ(r.global_hashes.size(), 1u);
  EXPECT_EQ(r.gpu["outer_quantize_on"], "device");
  ASSERT_GE(r.gpu["plans"].size(), 2u) << r.gpu["plans"].dump();
  EXPECT_GE(r.gpu["replans"].get<int>(), 1) << r.gpu["plans"].dump();
  EXPECT_LT(r.gpu["snapshot_host_bytes"].get<double>(), 0.4 * r.gpu["snapshot_fp32_bytes"].get<double>());
  EXPECT_GE(r.gpu_rounds.size(), 3u);
}

// The device's residual is checkpointed and restored: a run stopped at a checkpoint and
// resumed ends on the bits of the run never stopped (both quantized on the device).
TEST(CudaLoopDeviceQuantize, TheDeviceResidualSurvivesAResume) {
  REQUIRE_GPU_OR_SKIP();
  const DeviceQuantizeCase c{"resume", "interval: 4, compression: {codec: int4, block: 64, error_feedback: true}", 1,
                             12};
  std::map<std::string, DeviceQuantizeRun> runs;
  for (const bool cut : {false, true}) {
    TempDir d;
    d.file("k.psk", "0123456789abcdef-test-key");
    auto cfg =
        load(d, "c.yaml", device_quantize_yaml(d.path() / "out", c, fresh_port(), "device", ", checkpoint_every: 4"));
    if (cut) {
      run_device_quantize(cfg, c.cpu_sites, /*stop_at=*/8);
      run_device_quantize(cfg, c.cpu_sites, 0, /*resume=*/true);
    } else {
      run_device_quantize(cfg, c.cpu_sites);
    }
    runs[cut ? "cut" : "whole"] = read_device_quantize(d.path() / "out", c.cpu_sites);
  }
  EXPECT_EQ(runs["cut"].global_hashes, runs["whole"].global_hashes);
  EXPECT_EQ(runs["whole"].global_hashes.size(), 1u);
  EXPECT_EQ(hash_of(runs["cut"].gpu), hash_of(runs["whole"].gpu));
  EXPECT_EQ(runs["cut"].gpu["outer_quantize_on"], "device");
}

// NCCL inside the loop on one GPU: a 1-rank site given a real 1-rank NCCL communicator runs
// every collective of its strategy (all-reduce, reduce-scatter, all-gather, the norm's site
// sum) on device buffers and NCCL's stream; a sum over one rank is the identity, so it must
// end with the same bits as the same site without a collective.
TEST(CudaLoopNccl, OneRankNcclSiteEqualsTheSiteWithoutCollective) {
  REQUIRE_NCCL_DEVICE_OR_SKIP();
  for (const char* strategy : {"ddp", "zero1", "zero2", "fsdp"}) {
    TempDir d;
    auto plain = load(d, "p.yaml", config(d.path() / "p", "cuda", "bf16", strategy, 1, 8));
    auto nccl = load(d, "n.yaml", config(d.path() / "n", "cuda", "bf16", strategy, 1, 8));
    const auto want = run_site(plain);
    check_cuda(cudaSetDevice(0), "cudaSetDevice(0)");
    parallel::RendezvousOptions ro;
    ro.site = "s";
    ro.store_port = nccl.sites[0].port + 1;
    ro.cuda_device = 0;
    auto coll = parallel::make_nccl(ro);
    ASSERT_EQ(coll->memory(), parallel::MemorySpace::kCuda);
    trainer::TrainerOptions o;
    o.collective = coll.get();
    o.progress = false;
    o.cuda_device = 0;
    o.keep_one_rank_collective = true;  // else the one-rank site drops it and NCCL never runs
    const auto got = trainer::Trainer(nccl, o).run();
    EXPECT_EQ(hash_of(got), hash_of(want[0])) << strategy;
    EXPECT_EQ(loss_curve(nccl), loss_curve(plain)) << strategy;
    EXPECT_EQ(got["device"]["collective"], coll->backend()) << strategy;
  }
}

// A real NCCL site (one GPU per rank): only where there are two GPUs.
TEST(CudaLoopNccl, TwoGpuSiteTracksTheCpuRun) {
  REQUIRE_NCCL_DEVICE_OR_SKIP();
  if (device_count() < 2)
    GTEST_SKIP() << "needs 2 GPUs (NCCL refuses two ranks of one communicator on one device); found " << device_count();
  TempDir d;
  auto gcfg = load(d, "g.yaml", config(d.path() / "gpu", "cuda", "fp32", "zero2", 2, 12));
  auto ccfg = load(d, "c.yaml", config(d.path() / "cpu", "cpu", "fp32", "zero2", 2, 12));
  test::run_ranks(2, [&](int r) {
    app::RankOptions o;
    o.rank = r;
    o.progress = false;
    app::run_rank(gcfg, o);
  });
  run_site(ccfg);
  const ErrorStats s = compare(loss_curve(gcfg), loss_curve(ccfg));
  EXPECT_TRUE(within(s, tolerance("train.loss", Precision::Fp32))) << s.rel_l2;
}

}  // namespace
}  // namespace geoloco::cuda::testing

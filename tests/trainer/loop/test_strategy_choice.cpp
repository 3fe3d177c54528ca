// site.strategy: auto and hybrid's config: the choice per topology fixture (the seed finding:
// fsdp on an NVLink switch, hybrid on bridged pairs, never fsdp on PCIe), the fallback when the
// islands cannot be groups of consecutive ranks, the config's refusals, and a run whose strategy
// auto chose (hybrid) ending where the same run with hybrid written out ends.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <chrono>
#include <cstdlib>

#include "test_util.hpp"
#include "tests/support/ports.hpp"
#include "tests/support/threads.hpp"
#include "trainer/loop/run_config.hpp"
#include "trainer/loop/strategy_choice.hpp"
#include "trainer/loop/trainer.hpp"
#include "trainer/parallel/gloo_collective.hpp"

using namespace geoloco;
using namespace geoloco::trainer;
using geoloco::test::TempDir;

namespace {

std::string fixture(const std::string& name) {
  return std::string(GEOLOCO_SOURCE_DIR) + "/tests/planner/fixtures/" + name;
}

// A 1.3B-parameter GPT (24 layers) on an 8-rank site, one 2048-token sequence per micro-batch
// at 160 achieved TFLOP/s: 0.1 s of compute per micro-batch.
std::string big_site(const std::string& topology, int grad_accum, int ranks = 8) {
  return "run: {name: x}\n"
         "model: {n_layer: 24, n_head: 16, n_embd: 2048, block_size: 2048, vocab_size: 50304}\n"
         "data: {train: {kind: synthetic}}\n"
         "train: {micro_batch: 1, grad_accum: " +
         std::to_string(grad_accum) +
         "}\n"
         "site: {strategy: auto, topology: {file: " +
         topology +
         ", gpu_tflops: 160}}\n"
         "sites: [{name: a, ranks: " +
         std::to_string(ranks) + ", port: 30000}]\n";
}

RunConfig parse(const std::string& yaml) { return parse_run_config(config::load_string(yaml, "run.yaml")); }

std::string error_of(const std::string& yaml) {
  try {
    parse(yaml);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "<no error>";
}

}  // namespace

TEST(StrategyAuto, TheChoicePerFixture) {
  struct Case {
    const char* file;
    int grad_accum;
    const char* strategy;
    int group_size;
  };
  // NVSwitch: sharding is as fast as replication with far less memory. Bridged pairs with
  // accumulation: fsdp falls ~3.4x behind; shard in the pair, replicate across pairs. PCIe only:
  // no island to shard in; zero1 keeps ddp's speed.
  for (const Case c : {Case{"dgx_h100.txt", 8, "fsdp", 0}, Case{"dgx_h100.txt", 1, "fsdp", 0},
                       Case{"bridged_pairs.txt", 8, "hybrid", 2}, Case{"pcie_only.txt", 8, "zero1", 0}}) {
    SCOPED_TRACE(::testing::Message() << c.file << " grad_accum " << c.grad_accum);
    const RunConfig cfg = parse(big_site(fixture(c.file), c.grad_accum));
    const SiteConfig& s = cfg.sites[0];
    EXPECT_TRUE(s.strategy_auto);
    EXPECT_EQ(s.strategy, c.strategy) << s.strategy_reason;
    EXPECT_EQ(s.group_size, c.group_size);
    EXPECT_NE(s.strategy_reason.find(std::string(c.strategy) + " is"), std::string::npos) << s.strategy_reason;
  }
  // Two DGX H100 nodes (16 ranks) joined at 50 GB/s per GPU: sharding across the network costs
  // 1.5x, so shard inside each node's NVSwitch island and replicate across the nodes (HSDP).
  {
    std::string yaml = big_site(fixture("dgx_h100.txt"), 8, 16);
    yaml.replace(yaml.find("gpu_tflops: 160"), 15, "gpu_tflops: 160, nodes: 2");
    const SiteConfig s = parse(yaml).sites[0];
    EXPECT_EQ(s.strategy, "hybrid") << s.strategy_reason;
    EXPECT_EQ(s.group_size, 8);
    EXPECT_NE(s.strategy_reason.find("fsdp would be 1.5"), std::string::npos) << s.strategy_reason;
    EXPECT_NE(s.strategy_reason.find("net 50 GB/s"), std::string::npos) << s.strategy_reason;
    yaml.replace(yaml.find("ranks: 16"), 9, "ranks: 12");
    EXPECT_NE(error_of(yaml).find("has 8 GPUs per node x 2 nodes but site 'a' has 12 ranks"), std::string::npos)
        << error_of(yaml);
  }
  // The workload is the run's: 6 x 1.3B x 2048 x 8 tokens at 160 TFLOP/s.
  const RunConfig cfg = parse(big_site(fixture("bridged_pairs.txt"), 8));
  const auto w = site_workload(cfg, 0);
  EXPECT_NEAR(w.compute_s, 6.0 * static_cast<double>(cfg.model.num_params()) * 2048 * 8 / 160e12, 1e-12);
  EXPECT_EQ(w.micro_batches, 8);
  EXPECT_EQ(w.layers, 24);
}

// NVLink pairs {0, 2} and {1, 3}: the model recommends hybrid, but groups of consecutive ranks
// would put each group across PCIe: auto says so and takes the best of the other four.
TEST(StrategyAuto, IslandsThatAreNotConsecutiveRanksFallBack) {
  TempDir d;
  const std::string topo = d.file("crossed.yaml",
                                  "format: geoloco-topology\nversion: 1\ngpus: 4\n"
                                  "links:\n  - {gpus: [0, 2], kind: nvlink, bandwidth_gbs: 56}\n"
                                  "  - {gpus: [1, 3], kind: nvlink, bandwidth_gbs: 56}\n"
                                  "default: {kind: pcie_host, bandwidth_gbs: 25}\n");
  const RunConfig cfg = parse(big_site(topo, 8, 4));
  const auto choice = choose_strategy(cfg, 0, planner::load_topology_file(topo));
  ASSERT_EQ(choice.plan.recommended, planner::Strategy::Hybrid) << "the case must exercise the fallback";
  EXPECT_NE(choice.strategy, "hybrid");
  EXPECT_NE(choice.reason.find("not equal runs of consecutive GPUs"), std::string::npos) << choice.reason;
  EXPECT_EQ(cfg.sites[0].strategy, choice.strategy);
}

TEST(StrategyAuto, ConfigRefusals) {
  const std::string base =
      "run: {name: x}\nmodel: {n_layer: 2, n_head: 2, n_embd: 32, block_size: 16, vocab_size: 64}\n"
      "data: {train: {kind: synthetic}}\n";
  EXPECT_NE(error_of(base + "sites: [{name: a, ranks: 4, port: 30000, strategy: hybrid}]\n")
                .find("sites[0].group_size: strategy: hybrid needs group_size"),
            std::string::npos);
  EXPECT_NE(error_of(base + "sites: [{name: a, ranks: 4, port: 30000, strategy: hybrid, group_size: 3}]\n")
                .find("got 3, which does not divide the site's 4 ranks"),
            std::string::npos);
  EXPECT_NE(error_of(base + "site: {strategy: auto}\n")
                .find("site.topology: strategy: auto on a cpu site needs topology.file"),
            std::string::npos);
  EXPECT_NE(error_of(base + "site: {strategy: auto, topology: {file: " + fixture("dgx_h100.txt") +
                     "}}\nsites: [{name: a, ranks: 4, port: 30000}]\n")
                .find("has 8 GPUs but site 'a' has 4 ranks"),
            std::string::npos);
  EXPECT_NE(error_of(base + "site: {strategy: auto, topology: {file: no_such.txt}}\n").find("site.topology:"),
            std::string::npos);
  EXPECT_NE(error_of(base + "site: {strategy: auto, topology: {file: x.txt, gpu_tflop: 3}}\n")
                .find("site.topology.gpu_tflop: unknown key"),
            std::string::npos);
}

// A 4-rank CPU site rehearsing a bridged-pairs workstation (configs/links/topo_bridged_pairs.yaml)
// with a compute time that makes the model pick hybrid over pairs; the run then trains exactly
// as the same config with `strategy: hybrid, group_size: 2` written out.
TEST(StrategyAuto, ARunWhoseStrategyAutoChoseHybrid) {
  const std::string topo = std::string(GEOLOCO_SOURCE_DIR) + "/configs/links/topo_bridged_pairs.yaml";
  auto run = [&](const std::string& site) {
    TempDir d;
    const int port = test::fresh_port();
    auto cfg = load_run_config(
        d.file("run.yaml", geoloco::testing::tiny_config(d.path() / "out", "",
                                                         "site: {" + site + "}\nsites: [{name: s, ranks: 4, port: " +
                                                             std::to_string(port) + "}]\n")),
        {"train.steps=8", "train.grad_accum=1"});
    const auto run = geoloco::testing::run_site_threads(cfg, port + 4);
    const auto& params = run.params;
    const auto& summaries = run.summaries;
    for (int r = 1; r < 4; ++r) EXPECT_EQ(params[0], params[size_t(r)]);
    return std::make_pair(params[0], summaries[0]);
  };
  const auto [chosen, s] = run("strategy: auto, topology: {file: " + topo + ", gpu_tflops: 1}");
  EXPECT_EQ(s["memory"]["strategy"], "hybrid") << s["strategy_choice"].dump();
  EXPECT_EQ(s["strategy_choice"]["group_size"], 2);
  EXPECT_NE(s["strategy_choice"]["reason"].get<std::string>().find("hybrid is the fastest"), std::string::npos);
  const auto written = run("strategy: hybrid, group_size: 2");
  EXPECT_EQ(chosen, written.first);
}

namespace {

planner::HostTopologyOptions nvidia_smi_at(const std::string& path) {
  planner::HostTopologyOptions o;
  o.nvidia_smi = path;
  return o;
}

// A script standing in for nvidia-smi (what GEOLOCO_NVIDIA_SMI names for the CLI).
planner::HostTopologyOptions fake_nvidia_smi(const TempDir& d, const std::string& body) {
  const std::string path = d.file("nvidia-smi", "#!/bin/sh\n" + body);
  ::chmod(path.c_str(), 0755);
  return nvidia_smi_at(path);
}

// A site whose strategy waits for the host's topology (what a cuda site without
// topology.file is after config load); the rest of the config is a CPU one.
RunConfig waiting_for_host(const std::string& yaml) {
  RunConfig cfg = parse(yaml);
  cfg.sites[0].strategy = "auto";
  cfg.sites[0].strategy_auto = true;
  return cfg;
}

}  // namespace

// A cuda site without topology.file: the site's rank 0 runs nvidia-smi topo -m (here a script
// printing the bridged-pairs fixture) and the choice is the fixture's.
TEST(StrategyAuto, AtStartFromTheHostsNvidiaSmi) {
  TempDir d;
  const auto smi = fake_nvidia_smi(d, "cat " + fixture("bridged_pairs.txt") + "\n");
  const RunConfig cfg = waiting_for_host(big_site(fixture("bridged_pairs.txt"), 8));
  const RunConfig chosen = choose_strategy_at_start(cfg, 0, 0, nullptr, smi);
  EXPECT_EQ(chosen.sites[0].strategy, "hybrid");
  EXPECT_EQ(chosen.sites[0].group_size, 2);
  EXPECT_EQ(chosen.sites[0].topology.file, "nvidia-smi topo -m");
  EXPECT_EQ(cfg.sites[0].strategy, "auto") << "the given config is left alone";
}

// Two ranks: only rank 0 asks the host; its text -- or its failure -- reaches rank 1, so both
// choose the same or fail with the same message (never one rank waiting for the other).
TEST(StrategyAuto, AtStartRankZerosAnswerReachesEveryRank) {
  TempDir d;
  const std::string two_gpus = d.file("two.txt",
                                      "\tGPU0\tGPU1\tCPU Affinity\n"
                                      "GPU0\t X \tNV4\t0-7\n"
                                      "GPU1\tNV4\t X \t0-7\n");
  const RunConfig cfg = waiting_for_host(big_site(two_gpus, 8, 2));
  for (const bool fails : {false, true}) {
    const auto smi =
        fake_nvidia_smi(d, fails ? "echo 'NVML: driver not loaded' >&2\nexit 3\n" : "cat " + two_gpus + "\n");
    const int port = test::fresh_port();
    std::vector<std::string> got(2);
    test::run_ranks(2, [&](int r) {
      parallel::RendezvousOptions ro;
      ro.site = "a";
      ro.rank = r;
      ro.size = 2;
      ro.store_port = port;
      ro.timeout = std::chrono::milliseconds(20000);
      auto coll = parallel::make_gloo(ro);
      try {
        // Only rank 0 runs the program: rank 1's would fail if it did.
        const planner::HostTopologyOptions host = r == 0 ? smi : nvidia_smi_at("/nonexistent/nvidia-smi");
        got[size_t(r)] = choose_strategy_at_start(cfg, 0, r, coll.get(), host).sites[0].strategy;
      } catch (const InputError& e) {
        got[size_t(r)] = e.what();
      }
    });
    EXPECT_EQ(got[0], got[1]);
    if (fails) {
      EXPECT_NE(got[0].find("site 'a': strategy: auto:"), std::string::npos) << got[0];
      EXPECT_NE(got[0].find("topo -m: exit status 3: NVML: driver not loaded"), std::string::npos) << got[0];
    } else {
      EXPECT_EQ(got[0], "fsdp") << "one NVLink island of both GPUs";
    }
  }
}

TEST(StrategyAuto, AtStartACommandThatIsNotThereSaysSo) {
  const RunConfig cfg = waiting_for_host(big_site(fixture("dgx_h100.txt"), 8));
  try {
    choose_strategy_at_start(cfg, 0, 0, nullptr, nvidia_smi_at("/nonexistent/nvidia-smi"));
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(),
                 "site 'a': strategy: auto: /nonexistent/nvidia-smi topo -m: cannot run it: No such file or directory "
                 "(give site.topology.file instead)");
  }
}

// The deadline: an nvidia-smi that hangs is killed, and the site's strategy fails with a
// message instead of waiting for it.
TEST(StrategyAuto, AtStartANvidiaSmiThatHangsIsCutOff) {
  TempDir d;
  auto smi = fake_nvidia_smi(d, "echo partial\nexec sleep 100\n");
  smi.timeout_s = 0.3;
  const RunConfig cfg = waiting_for_host(big_site(fixture("dgx_h100.txt"), 8));
  const auto t0 = std::chrono::steady_clock::now();
  try {
    choose_strategy_at_start(cfg, 0, 0, nullptr, smi);
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(),
                 ("site 'a': strategy: auto: " + smi.nvidia_smi + " topo -m: no complete answer within 0.3 s").c_str());
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
}

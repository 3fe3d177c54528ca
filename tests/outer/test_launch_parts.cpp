// Each campus launches its own part of a run (`geoloco launch CONFIG --site NAME [--node I]`):
// which ranks a launch starts, and a run of three launches -- one site, and a site spanning
// two nodes (two loopback addresses) -- as real processes.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "../loop/test_util.hpp"
#include "tests/outer/processes.hpp"
#include "tests/support/ports.hpp"
#include "trainer/app/launch_selection.hpp"
#include "trainer/core/error.hpp"
#include "trainer/loop/run_config.hpp"

using namespace geoloco;
using app::LaunchRank;
using geoloco::test::fresh_port;
using geoloco::test::TempDir;
using geoloco::testing::Proc;
using geoloco::testing::slurp;

namespace {

std::string config_text(const std::filesystem::path& out, int port, int steps) {
  return "run: {name: parts, seed: 3, output_dir: " + out.string() +
         "}\n"
         "model: {n_layer: 2, n_head: 2, n_embd: 32, block_size: 16, vocab_size: 32}\n"
         "data:\n  train: {kind: synthetic, vocab: 32, branching: 3, seed: 5, tokens: 100000}\n"
         "train: {steps: " +
         std::to_string(steps) +
         ", micro_batch: 2, log_every: 5}\n"
         "outer: {interval: 4, compression: {codec: int8}}\n"
         "sites:\n"
         "  - {name: paris, ranks: 1, port: " +
         std::to_string(port) +
         "}\n"
         "  - {name: lyon, ranks: 3, hosts: [127.0.0.1, 127.0.0.2, 127.0.0.2], port: " +
         std::to_string(port + 10) +
         "}\n"
         "transport: {psk_file: k.psk, timeout_s: 60}\n";
}

}  // namespace

TEST(LaunchParts, SitesAndNodesSelectTheirRanks) {
  TempDir d;
  d.file("k.psk", "0123456789abcdef-test-key");
  const auto cfg = trainer::load_run_config(d.file("c.yaml", config_text(d.path() / "out", 30000, 8)));
  using V = std::vector<LaunchRank>;
  EXPECT_EQ(app::select_launch_ranks(cfg, {}, -1), (V{{0, 0}, {1, 0}, {1, 1}, {1, 2}}));
  EXPECT_EQ(app::select_launch_ranks(cfg, {"lyon"}, -1), (V{{1, 0}, {1, 1}, {1, 2}}));
  EXPECT_EQ(app::select_launch_ranks(cfg, {"lyon", "paris"}, -1), (V{{0, 0}, {1, 0}, {1, 1}, {1, 2}}));
  EXPECT_EQ(app::site_nodes(cfg.sites[1]), (std::vector<std::string>{"127.0.0.1", "127.0.0.2"}));
  EXPECT_EQ(app::select_launch_ranks(cfg, {"lyon"}, 0), (V{{1, 0}}));
  EXPECT_EQ(app::select_launch_ranks(cfg, {"lyon"}, 1), (V{{1, 1}, {1, 2}}));
  auto refused = [&](const std::vector<std::string>& sites, int node, const std::string& part) {
    try {
      app::select_launch_ranks(cfg, sites, node);
      ADD_FAILURE() << "accepted: " << part;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  refused({"rome"}, -1, "--site rome: no such site");
  refused({"rome"}, -1, "its sites: paris, lyon");
  refused({}, 0, "give exactly one --site");
  refused({"paris", "lyon"}, 0, "give exactly one --site");
  refused({"paris"}, 0, "site paris runs on one node");
  refused({"lyon"}, 2, "site lyon has 2 nodes (127.0.0.1, 127.0.0.2); expected 0..1");
}

// Three launches as three campuses' parts: paris, and lyon's two nodes (127.0.0.1 with rank
// 0 and the rendezvous, 127.0.0.2 with ranks 1 and 2). Lyon's collectives cross between its
// nodes' addresses; the run ends with one global hash on every rank, and the launch holding
// the first site prints the run's summary.
TEST(LaunchParts, EachCampusLaunchesItsOwnPartAndTheRunAgrees) {
  TempDir d;
  d.file("k.psk", "0123456789abcdef-test-key");
  const std::string cfg = d.file("c.yaml", config_text(d.path() / "out", fresh_port(), 12));
  const std::vector<std::vector<std::string>> parts = {{"launch", cfg, "--plain", "--site", "lyon", "--node", "1"},
                                                       {"launch", cfg, "--plain", "--site", "paris"},
                                                       {"launch", cfg, "--plain", "--site", "lyon", "--node", "0"}};
  std::vector<Proc> procs;
  for (size_t i = 0; i < parts.size(); ++i)
    procs.push_back(geoloco::testing::spawn(parts[i], (d.path() / ("launch" + std::to_string(i) + ".log")).string()));
  for (auto& p : procs) EXPECT_EQ(geoloco::testing::wait_for(p, std::chrono::seconds(240)), 0) << slurp(p.log);
  const std::string paris_log = slurp((d.path() / "launch1.log").string());
  EXPECT_NE(paris_log.find("launching 1 of the run's 4 ranks here: paris"), std::string::npos) << paris_log;
  const std::string lyon1 = slurp((d.path() / "launch0.log").string());
  EXPECT_NE(lyon1.find("launching 2 of the run's 4 ranks here: lyon node 1"), std::string::npos) << lyon1;
  EXPECT_NE(lyon1.find("[lyon/2]"), std::string::npos) << lyon1;
  EXPECT_EQ(lyon1.find("[lyon/0]"), std::string::npos) << lyon1;
  const auto summary = nlohmann::json::parse(slurp((d.path() / "out" / "summary.json").string()), nullptr, false);
  ASSERT_TRUE(summary.is_object());
  ASSERT_EQ(summary["ranks"].size(), 4u);
  std::set<std::string> hashes;
  for (const auto& r : summary["ranks"]) hashes.insert(r["global_weights_hash"].get<std::string>());
  EXPECT_EQ(hashes.size(), 1u) << summary.dump();
  EXPECT_NE(paris_log.find("outer steps across 2 sites"), std::string::npos) << paris_log;
}

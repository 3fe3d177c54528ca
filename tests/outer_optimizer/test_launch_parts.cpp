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

#include "tests/trainer/loop/test_util.hpp"
#include "tests/outer_optimizer/processes.hpp"
#include "tests/support/ports.hpp"
#include "trainer/app/launch_selection.hpp"
#include "trainer/app/rank_address.hpp"
#include "core/error.hpp"
#include "trainer/loop/run_config.hpp"

using namespace geoloco;
using app::LaunchRank;
using geoloco::test::fresh_port;
using geoloco::test::TempDir;
using geoloco::testing::Proc;
using geoloco::testing::slurp;

namespace {

std::string config_text(const std::filesystem::path& out, int port, int steps, const std::string& paris = "ranks: 1",
                        const std::string& lyon = "ranks: 3, hosts: [127.0.0.1, 127.0.0.2, 127.0.0.2]") {
  return "run: {name: parts, seed: 3, output_dir: " + out.string() +
         "}\n"
         "model: {n_layer: 2, n_head: 2, n_embd: 32, block_size: 16, vocab_size: 32}\n"
         "data:\n  train: {kind: synthetic, vocab: 32, branching: 3, seed: 5, tokens: 100000}\n"
         "train: {steps: " +
         std::to_string(steps) +
         ", micro_batch: 2, log_every: 5}\n"
         "outer: {interval: 4, compression: {codec: int8}}\n"
         "sites:\n"
         "  - {name: paris, " +
         paris + ", port: " + std::to_string(port) +
         "}\n"
         "  - {name: lyon, " +
         lyon + ", port: " + std::to_string(port + 10) +
         "}\n"
         "transport: {psk_file: k.psk, timeout_s: 60}\n";
}

// Runs the launches at once (launch<i>.log in `d`); each must succeed, and the run's summary
// (written under d/out by the first site's launch) must hold 4 ranks on one global hash.
nlohmann::json launch_parts_and_agree(const TempDir& d, const std::vector<std::vector<std::string>>& parts) {
  std::vector<Proc> procs;
  for (size_t i = 0; i < parts.size(); ++i)
    procs.push_back(geoloco::testing::spawn(parts[i], (d.path() / ("launch" + std::to_string(i) + ".log")).string()));
  for (auto& p : procs) EXPECT_EQ(geoloco::testing::wait_for(p, std::chrono::seconds(240)), 0) << slurp(p.log);
  const auto summary = nlohmann::json::parse(slurp((d.path() / "out" / "summary.json").string()), nullptr, false);
  EXPECT_TRUE(summary.is_object());
  if (!summary.is_object()) return summary;
  EXPECT_EQ(summary["ranks"].size(), 4u);
  std::set<std::string> hashes;
  for (const auto& r : summary["ranks"]) hashes.insert(r.value("global_weights_hash", std::string()));
  EXPECT_EQ(hashes.size(), 1u) << summary.dump();
  return summary;
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
  launch_parts_and_agree(d, {{"launch", cfg, "--plain", "--site", "lyon", "--node", "1"},
                             {"launch", cfg, "--plain", "--site", "paris"},
                             {"launch", cfg, "--plain", "--site", "lyon", "--node", "0"}});
  const std::string paris_log = slurp((d.path() / "launch1.log").string());
  EXPECT_NE(paris_log.find("launching 1 of the run's 4 ranks here: paris"), std::string::npos) << paris_log;
  const std::string lyon1 = slurp((d.path() / "launch0.log").string());
  EXPECT_NE(lyon1.find("launching 2 of the run's 4 ranks here: lyon node 1"), std::string::npos) << lyon1;
  EXPECT_NE(lyon1.find("[lyon/2]"), std::string::npos) << lyon1;
  EXPECT_EQ(lyon1.find("[lyon/0]"), std::string::npos) << lyon1;
  EXPECT_NE(paris_log.find("outer steps across 2 sites"), std::string::npos) << paris_log;
}

// A site across nodes that names only node 0's address (`nodes: 2`): its runs of ranks are its
// nodes, and a rank beyond node 0 binds the address it is given or finds the one that reaches
// node 0; node 0 and sites with configured addresses refuse a contradicting one.
TEST(LaunchParts, ASiteOfNodesSelectsItsRunsOfRanksAndItsRanksFindTheirAddresses) {
  TempDir d;
  d.file("k.psk", "0123456789abcdef-test-key");
  const auto cfg = trainer::load_run_config(
      d.file("c.yaml", config_text(d.path() / "out", 30000, 8, "ranks: 1", "ranks: 4, nodes: 2")));
  using V = std::vector<LaunchRank>;
  const auto& lyon = cfg.sites[1];
  EXPECT_TRUE(lyon.finds_addresses());
  EXPECT_EQ(app::site_nodes(lyon), (std::vector<std::string>{"127.0.0.1", "lyon#node1"}));
  EXPECT_EQ(app::select_launch_ranks(cfg, {"lyon"}, 0), (V{{1, 0}, {1, 1}}));
  EXPECT_EQ(app::select_launch_ranks(cfg, {"lyon"}, 1), (V{{1, 2}, {1, 3}}));
  EXPECT_EQ(lyon.node_of(3), 1);
  EXPECT_EQ(app::rank_address(lyon, 0, ""), "127.0.0.1");
  EXPECT_EQ(app::rank_address(lyon, 1, "127.0.0.1"), "127.0.0.1");
  EXPECT_EQ(app::rank_address(lyon, 2, "127.0.0.9"), "127.0.0.9");
  EXPECT_EQ(app::rank_address(lyon, 3, ""), "127.0.0.1");  // the interface that reaches 127.0.0.1
  auto refused = [](const trainer::SiteConfig& s, int rank, const std::string& given, const std::string& part) {
    try {
      app::rank_address(s, rank, given);
      ADD_FAILURE() << "accepted: " << part;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  refused(lyon, 2, "lyon-2", "'lyon-2': not an IPv4 address to bind");
  refused(lyon, 2, "0.0.0.0", "not an IPv4 address to bind");
  refused(lyon, 0, "127.0.0.9", "rank 0 of site lyon binds 127.0.0.1 from the config (node 0 binds host)");
  refused(cfg.sites[0], 0, "127.0.0.9", "rank 0 of site paris binds 127.0.0.1 from the config (host/hosts)");
  // The config's checks.
  auto bad = [&](const std::string& lyon_spec, const std::string& part) {
    try {
      trainer::load_run_config(d.file("b.yaml", config_text(d.path() / "out", 30000, 8, "ranks: 1", lyon_spec)));
      ADD_FAILURE() << "accepted: " << lyon_spec;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  // strategy: auto's model sees the site's nodes: topology.nodes follows them and may only repeat them.
  EXPECT_EQ(lyon.topology.nodes, 2);
  EXPECT_EQ(cfg.sites[0].topology.nodes, 1);
  bad("ranks: 4, nodes: 2, topology: {nodes: 4}", "topology.nodes is 4, but the site's ranks are on 2 nodes (nodes)");
  bad("ranks: 3, nodes: 2", "3 ranks do not split evenly over 2 nodes");
  bad("ranks: 2, nodes: 3", "nodes");
  bad("ranks: 2, nodes: 2, hosts: [127.0.0.1, 127.0.0.2]", "give either nodes");
}

// Three launches again, lyon's second node now found, not configured: the config gives lyon
// `nodes: 2` and node 0's address only; node 1's launch binds 127.0.0.2 (--bind-address).
// Paris dials lyon's rank 1 there, an address it learns only from lyon's rank 0 (its gate's
// site directory): nothing listens at the configured address on that rank's port.
TEST(LaunchParts, ASiteWhoseNodesFindTheirAddressesIsReachedThroughItsDirectory) {
  TempDir d;
  d.file("k.psk", "0123456789abcdef-test-key");
  const std::string cfg =
      d.file("c.yaml", config_text(d.path() / "out", fresh_port(), 12, "ranks: 2", "ranks: 2, nodes: 2"));
  const auto summary = launch_parts_and_agree(
      d, {{"launch", cfg, "--plain", "--site", "lyon", "--node", "1", "--bind-address", "127.0.0.2"},
          {"launch", cfg, "--plain", "--site", "paris"},
          {"launch", cfg, "--plain", "--site", "lyon", "--node", "0"}});
  // Every rank's summary says where it listened.
  std::set<std::string> where;
  for (const auto& r : summary.value("ranks", nlohmann::json::array()))
    where.insert(fmt::format("{}/{} {}", r.value("site", ""), r.value("rank", -1), r.value("address", "")));
  EXPECT_EQ(where,
            (std::set<std::string>{"paris/0 127.0.0.1", "paris/1 127.0.0.1", "lyon/0 127.0.0.1", "lyon/1 127.0.0.2"}));
  const std::string lyon1 = slurp((d.path() / "launch0.log").string());
  EXPECT_NE(lyon1.find("lyon/1 listening on 127.0.0.2:"), std::string::npos) << lyon1;
  const std::string lyon0 = slurp((d.path() / "launch2.log").string());
  EXPECT_NE(lyon0.find("site lyon: 2 ranks on 2 nodes at 127.0.0.1, 127.0.0.2"), std::string::npos) << lyon0;
}

// Multi-site failure paths with real processes: `geoloco worker` per site.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>

#include "tests/trainer/loop/test_util.hpp"
#include "tests/outer_optimizer/processes.hpp"
#include "tests/support/ports.hpp"

using geoloco::test::fresh_port;
using geoloco::test::TempDir;
using namespace geoloco::testing;

namespace {

std::string config(const TempDir& d, int port, const std::string& extra = "") {
  d.file("k.psk", "0123456789abcdef-test-key");
  d.file("other.psk", "fedcba9876543210-other-key");
  return d.file("c.yaml", "run: {name: p, seed: 3, output_dir: " + (d.path() / "out").string() +
                              "}\n"
                              "model: {n_layer: 2, n_head: 2, n_embd: 64, block_size: 32, vocab_size: 64}\n"
                              "data:\n  train: {kind: synthetic, vocab: 64, branching: 3, seed: 5}\n"
                              "train: {steps: 40, micro_batch: 4, log_every: 2}\n"
                              "outer: {interval: 2, compression: {codec: fp32}}\n"
                              "sites:\n  - {name: paris, port: " +
                              std::to_string(port) + "}\n  - {name: lyon, port: " + std::to_string(port + 10) +
                              "}\n"
                              "transport: {psk_file: k.psk, connect_timeout_s: 20, transfer_timeout_s: 3}\n" +
                              extra);
}

}  // namespace

// lyon is SIGKILLed while a sync is on the wire: the transport paces transfers to 2 Mbit/s, so
// a sync's pseudo-gradient (about 420 kB in fp32) takes ~1.7 s to leave, and the kill follows
// the debug line lyon logs as round 2's frames are posted. paris fails within the transfer
// timeout plus a bound, naming the round and lyon.
TEST(OuterProcesses, PeerKilledMidTransferFailsTheOthersNamingThePeer) {
  TempDir d;
  auto cfg = config(d, fresh_port(), "");
  // Two sites need both (min_sites: a majority): paris waits 2 s for a membership, then stops.
  std::vector<std::string> slow = {
      "--set", "transport.emulate.rate_mbit=2", "--set", "outer.quorum_wait_s=2", "--set", "run.log_level=debug"};
  auto args = [&](const char* site) {
    std::vector<std::string> a = {"worker", cfg, "--site", site, "--rank", "0"};
    a.insert(a.end(), slow.begin(), slow.end());
    return a;
  };
  Proc paris = spawn(args("paris"), (d.path() / "paris.log").string());
  Proc lyon = spawn(args("lyon"), (d.path() / "lyon.log").string());
  ASSERT_TRUE(contains(lyon.log, "outer round 2 (inner step 4) on the wire", std::chrono::seconds(60)))
      << slurp(lyon.log);
  kill(lyon.pid, SIGKILL);
  const auto t0 = Clock::now();
  int rc = wait_for(paris, std::chrono::seconds(30));
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  wait_for(lyon, std::chrono::seconds(5));
  // lyon's log ends where it died: round 2's frames had been posted and the sync had not
  // completed, so the kill landed inside it (a slow poll of the log would show here).
  const std::string lyon_log = slurp(lyon.log);
  EXPECT_NE(lyon_log.find("outer step 1 at inner step 2"), std::string::npos) << lyon_log;
  EXPECT_EQ(lyon_log.find("outer step 2 at inner step 4"), std::string::npos)
      << "lyon was killed after round 2's sync completed, not during it:\n"
      << lyon_log;
  EXPECT_EQ(rc, 1) << slurp(paris.log);
  EXPECT_LT(took, 3.0 + 10.0) << "transfer timeout 3 s";
  // One line names the outer step lyon died in, the inner step and the peer.
  const std::string log = slurp(paris.log);
  const size_t at = log.find("geoloco: failed: outer step ");
  ASSERT_NE(at, std::string::npos) << log;
  const std::string line = log.substr(at, log.find('\n', at) - at);
  EXPECT_NE(line.find("outer step 2 (inner step 4)"), std::string::npos) << line;
  EXPECT_NE(line.find("lyon/0"), std::string::npos) << line;
}

// Sites whose configs differ are refused at the handshake: both exit non-zero, naming the
// config hash.
TEST(OuterProcesses, ConfigHashMismatchIsRefused) {
  TempDir d;
  auto cfg = config(d, fresh_port());
  Proc paris = spawn({"worker", cfg, "--site", "paris", "--rank", "0", "--set", "transport.connect_timeout_s=6"},
                     (d.path() / "paris.log").string());
  Proc lyon = spawn({"worker", cfg, "--site", "lyon", "--rank", "0", "--set", "transport.connect_timeout_s=6", "--set",
                     "train.micro_batch=8"},
                    (d.path() / "lyon.log").string());
  int a = wait_for(paris, std::chrono::seconds(40)), b = wait_for(lyon, std::chrono::seconds(40));
  EXPECT_NE(a, 0);
  EXPECT_NE(b, 0);
  EXPECT_NE(a, -1);
  EXPECT_NE(b, -1);
  std::string logs = slurp(paris.log) + slurp(lyon.log);
  EXPECT_NE(logs.find("config hash"), std::string::npos) << logs;
}

// A site with another pre-shared key is refused; the run fails cleanly on both sides.
TEST(OuterProcesses, WrongKeyIsRefused) {
  TempDir d;
  auto cfg = config(d, fresh_port());
  // The psk path is part of the config (and its hash): give lyon the other key under the
  // same name by swapping files between the two starts.
  Proc paris = spawn({"worker", cfg, "--site", "paris", "--rank", "0", "--set", "transport.connect_timeout_s=6"},
                     (d.path() / "paris.log").string());
  ASSERT_TRUE(contains(paris.log, "listening", std::chrono::seconds(20))) << slurp(paris.log);
  d.file("k.psk", "fedcba9876543210-other-key");
  Proc lyon = spawn({"worker", cfg, "--site", "lyon", "--rank", "0", "--set", "transport.connect_timeout_s=6"},
                    (d.path() / "lyon.log").string());
  int a = wait_for(paris, std::chrono::seconds(40)), b = wait_for(lyon, std::chrono::seconds(40));
  EXPECT_NE(a, 0);
  EXPECT_NE(b, 0);
  EXPECT_NE(a, -1);
  EXPECT_NE(b, -1);
  std::string logs = slurp(paris.log) + slurp(lyon.log);
  EXPECT_TRUE(logs.find("key") != std::string::npos || logs.find("HMAC") != std::string::npos ||
              logs.find("authentic") != std::string::npos)
      << logs;
  EXPECT_EQ(logs.find("0123456789abcdef"), std::string::npos) << "the key must never be logged";
  EXPECT_EQ(logs.find("fedcba9876543210"), std::string::npos) << "the key must never be logged";
}

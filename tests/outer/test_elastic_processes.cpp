// Sites as failure domains through real processes: `geoloco launch` runs four sites of one
// rank; one site's process is SIGKILLed during inner steps. The launcher takes only that site
// down, the other three commit the next round without it, finish with one global-weights
// hash, and the launch exits 0 with the eviction in summary.json. Also with the first site of
// the config as the one lost (it is the first proposer and the usual summary collector).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "../loop/test_util.hpp"
#include "tests/support/ports.hpp"

using geoloco::test::fresh_port;
using geoloco::test::TempDir;
using Clock = std::chrono::steady_clock;

namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The pid of the `geoloco worker` process of `site` started with `config`, or -1.
pid_t worker_pid(const std::string& config, const std::string& site) {
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmd = slurp((e.path() / "cmdline").string());
    std::vector<std::string> args;
    std::stringstream ss(cmd);
    for (std::string a; std::getline(ss, a, '\0');) args.push_back(a);
    bool worker = false, cfg = false, this_site = false;
    for (size_t i = 0; i < args.size(); ++i) {
      worker |= args[i] == "worker";
      cfg |= args[i] == config;
      this_site |= args[i] == "--site" && i + 1 < args.size() && args[i + 1] == site;
    }
    if (worker && cfg && this_site) return static_cast<pid_t>(std::stoi(name));
  }
  return -1;
}

struct Launched {
  int rc = -1;
  std::string log;
  nlohmann::json summary;
};

// Launches four sites, SIGKILLs `victim`'s process once its log shows outer step 2, and
// waits for the launch to end.
Launched launch_and_kill(const TempDir& d, const std::string& victim) {
  d.file("k.psk", "0123456789abcdef-test-key");
  const int port = fresh_port();
  std::string sites = "sites:\n";
  const char* names[] = {"paris", "lyon", "milan", "oslo"};
  for (int s = 0; s < 4; ++s)
    sites += "  - {name: " + std::string(names[s]) + ", port: " + std::to_string(port + 10 * s) + "}\n";
  const std::string cfg =
      d.file("c.yaml", "run: {name: el, seed: 3, output_dir: " + (d.path() / "out").string() +
                           "}\n"
                           "model: {n_layer: 2, n_head: 2, n_embd: 32, block_size: 16, vocab_size: 32}\n"
                           "data:\n  train: {kind: synthetic, vocab: 32, branching: 3, seed: 5, tokens: 100000}\n"
                           "train: {steps: 120, micro_batch: 2, log_every: 10, eval_every: 0, checkpoint_every: 0}\n"
                           "outer: {interval: 4, compression: {codec: int8}, deadline_s: 10, quorum_wait_s: 20, "
                           "consensus_retry_s: 0.2}\n" +
                           sites + "transport: {psk_file: k.psk, connect_timeout_s: 30, transfer_timeout_s: 10}\n");
  Launched out;
  const std::string log = (d.path() / "launch.log").string();
  const pid_t pid = fork();
  if (pid == 0) {
    FILE* f = freopen(log.c_str(), "w", stdout);
    (void)f;
    dup2(fileno(stdout), 2);
    std::string exe = std::string(GEOLOCO_BINARY_DIR) + "/geoloco";
    std::vector<std::string> args = {exe, "launch", cfg};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(exe.c_str(), argv.data());
    _exit(127);
  }
  const auto deadline = Clock::now() + std::chrono::seconds(120);
  bool killed = false;
  while (Clock::now() < deadline) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      out.rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      break;
    }
    if (!killed && slurp(log).find("[" + victim + "/0] ") != std::string::npos &&
        slurp(log).find("outer step 2 at inner step") != std::string::npos) {
      const pid_t w = worker_pid(cfg, victim);
      if (w > 0) {
        kill(w, SIGKILL);
        killed = true;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (out.rc < 0) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
  EXPECT_TRUE(killed) << "never saw outer step 2 of " << victim;
  out.log = slurp(log);
  std::ifstream in(d.path() / "out" / "summary.json");
  out.summary = nlohmann::json::parse(in, nullptr, false);
  return out;
}

void expect_survived(const Launched& r, const std::string& victim) {
  EXPECT_EQ(r.rc, 0) << r.log;
  EXPECT_NE(r.log.find("[launch] rank " + victim + "/0 was killed by signal 9"), std::string::npos) << r.log;
  EXPECT_NE(r.log.find("site " + victim + " leaves the run"), std::string::npos) << r.log;
  EXPECT_NE(r.log.find("site " + victim + " evicted"), std::string::npos) << r.log;
  ASSERT_TRUE(r.summary.is_object()) << r.log;
  const auto& m = r.summary["membership"];
  ASSERT_EQ(m["evictions"].size(), 1u) << r.summary.dump();
  EXPECT_EQ(m["evictions"][0]["site"], victim);
  EXPECT_EQ(m["members"].size(), 3u);
  for (const auto& s : m["members"]) EXPECT_NE(s, victim);
  // Every surviving rank ends with the run's hash.
  ASSERT_EQ(r.summary["ranks"].size(), 3u) << r.summary.dump();
  for (const auto& rk : r.summary["ranks"]) EXPECT_EQ(rk["global_weights_hash"], r.summary["global_weights_hash"]);
  EXPECT_EQ(r.summary.value("outer_steps", 0), 30);
}

}  // namespace

TEST(ElasticProcesses, ASiteSigkilledDuringInnerStepsLeavesAndTheOthersFinish) {
  TempDir d;
  expect_survived(launch_and_kill(d, "lyon"), "lyon");
}

TEST(ElasticProcesses, TheFirstSiteSigkilledAndTheRunGoesOn) {
  TempDir d;
  expect_survived(launch_and_kill(d, "paris"), "paris");
}

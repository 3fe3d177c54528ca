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

#include "tests/trainer/loop/test_util.hpp"
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

// The pid of the `geoloco worker` process of `site`/`rank` started with `config`, or -1.
pid_t worker_pid(const std::string& config, const std::string& site, int rank = 0) {
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmd = slurp((e.path() / "cmdline").string());
    std::vector<std::string> args;
    std::stringstream ss(cmd);
    for (std::string a; std::getline(ss, a, '\0');) args.push_back(a);
    bool worker = false, cfg = false, this_site = false, this_rank = false;
    for (size_t i = 0; i < args.size(); ++i) {
      worker |= args[i] == "worker";
      cfg |= args[i] == config;
      this_site |= args[i] == "--site" && i + 1 < args.size() && args[i + 1] == site;
      this_rank |= args[i] == "--rank" && i + 1 < args.size() && args[i + 1] == std::to_string(rank);
    }
    if (worker && cfg && this_site && this_rank) return static_cast<pid_t>(std::stoi(name));
  }
  return -1;
}

struct Launched {
  int rc = -1;
  std::string log;
  nlohmann::json summary;
};

struct Scenario {
  std::vector<std::pair<std::string, int>> sites = {{"paris", 1}, {"lyon", 1}, {"milan", 1}, {"oslo", 1}};
  std::string victim;  // its rank `victim_rank` gets `signal` once the log shows outer step 2
  int victim_rank = 0;
  int signal = SIGKILL;
  double stopped_s = 0;  // SIGSTOP only: SIGCONT after this long
  int steps = 120;
  double deadline_s = 10;
  std::vector<std::string> launch_args = {"--max-restarts", "0"};
};

// Launches the sites, signals the victim once its log shows outer step 2, and waits for the
// launch to end.
Launched launch_and_signal(const TempDir& d, const Scenario& sc) {
  d.file("k.psk", "0123456789abcdef-test-key");
  const int port = fresh_port();
  std::string sites = "sites:\n";
  for (size_t s = 0; s < sc.sites.size(); ++s)
    sites += "  - {name: " + sc.sites[s].first + ", ranks: " + std::to_string(sc.sites[s].second) +
             ", port: " + std::to_string(port + 10 * static_cast<int>(s)) + "}\n";
  const std::string cfg =
      d.file("c.yaml", "run: {name: el, seed: 3, output_dir: " + (d.path() / "out").string() +
                           "}\n"
                           "model: {n_layer: 2, n_head: 2, n_embd: 32, block_size: 16, vocab_size: 32}\n"
                           "data:\n  train: {kind: synthetic, vocab: 32, branching: 3, seed: 5, tokens: 100000}\n"
                           "train: {steps: " +
                           std::to_string(sc.steps) +
                           ", micro_batch: 2, log_every: 10, eval_every: 0, checkpoint_every: 0}\n"
                           "outer: {interval: 4, compression: {codec: int8}, deadline_s: " +
                           std::to_string(sc.deadline_s) + ", quorum_wait_s: 20, consensus_retry_s: 0.2}\n" + sites +
                           "transport: {psk_file: k.psk, connect_timeout_s: 30, transfer_timeout_s: 10}\n");
  Launched out;
  const std::string log = (d.path() / "launch.log").string();
  const pid_t pid = fork();
  if (pid == 0) {
    FILE* f = freopen(log.c_str(), "w", stdout);
    (void)f;
    dup2(fileno(stdout), 2);
    std::string exe = std::string(GEOLOCO_BINARY_DIR) + "/geoloco";
    std::vector<std::string> args = {exe, "launch", cfg};
    for (const auto& a : sc.launch_args) args.push_back(a);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(exe.c_str(), argv.data());
    _exit(127);
  }
  const auto deadline = Clock::now() + std::chrono::seconds(200);
  bool signalled = false, continued = sc.signal != SIGSTOP;
  pid_t w = -1;
  Clock::time_point stopped_at{};
  const std::string victim = "[" + sc.victim + "/" + std::to_string(sc.victim_rank) + "] ";
  while (Clock::now() < deadline) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      out.rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      break;
    }
    if (!signalled && slurp(log).find(victim) != std::string::npos &&
        slurp(log).find("outer step 2 at inner step") != std::string::npos) {
      w = worker_pid(cfg, sc.victim, sc.victim_rank);
      if (w > 0) {
        kill(w, sc.signal);
        signalled = true;
        stopped_at = Clock::now();
      }
    }
    if (signalled && !continued && Clock::now() - stopped_at >= std::chrono::duration<double>(sc.stopped_s)) {
      kill(w, SIGCONT);
      continued = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (out.rc < 0) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
  EXPECT_TRUE(signalled) << "never saw outer step 2 of " << sc.victim;
  out.log = slurp(log);
  std::ifstream in(d.path() / "out" / "summary.json");
  out.summary = nlohmann::json::parse(in, nullptr, false);
  return out;
}

Launched launch_and_kill(const TempDir& d, const std::string& victim) {
  Scenario sc;
  sc.victim = victim;
  return launch_and_signal(d, sc);
}

void expect_survived(const Launched& r, const std::string& victim) {
  EXPECT_EQ(r.rc, 0) << r.log;
  EXPECT_NE(r.log.find("[launch] rank " + victim + "/0 was killed by signal 9"), std::string::npos) << r.log;
  EXPECT_NE(r.log.find("site " + victim + " leaves the run"), std::string::npos) << r.log;
  EXPECT_NE(r.log.find("site " + victim + " evicted"), std::string::npos) << r.log;
  EXPECT_EQ(r.log.find("restart"), std::string::npos) << r.log;  // --max-restarts 0
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

// The victim site was evicted, restarted by the launcher, joined, and finished with the
// others: every site a member at the end, every rank of every site on the run's hash.
void expect_rejoined(const Launched& r, const Scenario& sc) {
  EXPECT_EQ(r.rc, 0) << r.log;
  EXPECT_NE(r.log.find("site " + sc.victim + " evicted"), std::string::npos) << r.log;
  EXPECT_NE(r.log.find("[launch] site " + sc.victim + ": restart 1 of 3: starting its"), std::string::npos) << r.log;
  EXPECT_NE(r.log.find("site " + sc.victim + " joins the run"), std::string::npos) << r.log;
  EXPECT_EQ(r.log.find("stays out of the run"), std::string::npos) << r.log;
  ASSERT_TRUE(r.summary.is_object()) << r.log;
  const auto& m = r.summary["membership"];
  ASSERT_GE(m["evictions"].size(), 1u) << r.summary.dump();
  EXPECT_EQ(m["evictions"][0]["site"], sc.victim);
  EXPECT_EQ(m["members"].size(), sc.sites.size()) << r.summary.dump();
  ASSERT_GE(m["joins"].size(), 1u) << r.summary.dump();
  EXPECT_EQ(m["joins"].back()["site"], sc.victim);
  size_t ranks = 0;
  for (const auto& [name, n] : sc.sites) ranks += static_cast<size_t>(n);
  ASSERT_EQ(r.summary["ranks"].size(), ranks) << r.summary.dump();
  for (const auto& rk : r.summary["ranks"]) EXPECT_EQ(rk["global_weights_hash"], r.summary["global_weights_hash"]);
  EXPECT_EQ(r.summary.value("outer_steps", 0), sc.steps / 4);
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

// Issue test 3: SIGKILL of one rank of a two-rank site. The site leaves the round (its other
// rank is stopped), the launcher starts both ranks again with --join, they are taken in and
// fetch the committed state, and the run ends with every rank of every site on one hash.
TEST(ElasticProcesses, ARankOfATwoRankSiteKilledTheLauncherRestartsTheSiteAndItRejoins) {
  TempDir d;
  Scenario sc;
  sc.sites = {{"paris", 2}, {"lyon", 2}, {"milan", 2}};
  sc.victim = "lyon";
  sc.victim_rank = 1;
  sc.steps = 1600;      // long enough for the restart (1 s backoff), the start-up and the join
  sc.launch_args = {};  // the default: --max-restarts 3
  const auto r = launch_and_signal(d, sc);
  EXPECT_NE(r.log.find("[launch] rank lyon/1 was killed by signal 9"), std::string::npos) << r.log;
  expect_rejoined(r, sc);
}

// Issue test 4: a site SIGSTOPped past the round's deadline, then SIGCONT. The others evict it
// and go on; on waking it learns it was evicted, commits nothing stale, and exits; the
// launcher restarts it with --join and it rejoins from its peers.
TEST(ElasticProcesses, ASiteStoppedPastTheDeadlineLearnsItWasEvictedAndRejoins) {
  TempDir d;
  Scenario sc;
  sc.sites = {{"paris", 1}, {"lyon", 1}, {"milan", 1}};
  sc.victim = "lyon";
  sc.signal = SIGSTOP;
  sc.stopped_s = 4;
  sc.deadline_s = 2;
  sc.steps = 8000;  // the two others must still be running when it is back and restarted
  sc.launch_args = {};
  const auto r = launch_and_signal(d, sc);
  // Awake, it finds its round's deadline passed: it stops rather than apply a round it could
  // not complete, and exits for the launcher to restart it.
  EXPECT_NE(r.log.find("[launch] rank lyon/0 exited with code 1; site lyon leaves the run"), std::string::npos)
      << r.log;
  expect_rejoined(r, sc);
}

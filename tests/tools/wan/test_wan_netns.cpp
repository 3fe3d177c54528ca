// End-to-end tests of the emulator through its scripts (tools/wan/up, check, down, run):
// RTT and throughput against the profile, loss fraction, refusal when a link is off, a link
// cut mid-transfer, and teardown after a crash. Root only; every command runs under
// `timeout` so nothing can hang, and every test tears down what it created.
#include <gtest/gtest.h>

#include "shell.hpp"
#include "tests/support/temp_dir.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kRoot = GEOLOCO_SOURCE_DIR;
const std::string kWan = kRoot + "/tools/wan/";
const std::string kPrefix = "glt";  // tests' own namespaces: glt-a, glt-b, glt-router

using geoloco::wan_test::Result;
using geoloco::wan_test::sh;

std::string state_dir() { return "/run/geoloco-wan/" + kPrefix; }

json read_json(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw std::runtime_error("cannot read " + path);
  return json::parse(f);
}

class WanNetns : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root: network namespaces, tc and iptables";
    if (sh("ip netns list", 10).rc != 0) GTEST_SKIP() << "'ip netns' is unavailable on this machine";
    ASSERT_EQ(sh("command -v iperf3 && command -v jq && command -v iptables", 10).rc, 0)
        << "iperf3, jq and iptables are required (tools/setup.sh installs them)";
    setenv("GEOLOCO_BIN", GEOLOCO_WAN_DEV_BIN, 1);
    tmp_.emplace("wan-test");
    dir_ = tmp_->path();
    sh(kWan + "down --prefix " + kPrefix, 30);  // a previous crashed test run
  }
  void TearDown() override {
    if (dir_.empty()) return;
    const Result r = sh(kWan + "down --prefix " + kPrefix, 30);
    EXPECT_EQ(r.rc, 0) << r.out;
    EXPECT_EQ(sh("ip netns list | grep -q \"^" + kPrefix + "-\"", 10).rc, 1) << "namespaces left behind";
    tmp_.reset();
  }

  // A two-site scenario file; `link` is the YAML flow mapping of the link profile.
  std::string scenario(const std::string& name, const std::string& link) {
    const std::string path = (dir_ / (name + ".yaml")).string();
    std::ofstream(path) << "format: geoloco-wan-scenario\nversion: 1\nname: " << name
                        << "\nsites: [{name: a}, {name: b}]\nlink: " << link << "\n";
    return path;
  }
  Result up(const std::string& scen, const std::string& extra = "") {
    return sh(kWan + "up --prefix " + kPrefix + " " + extra + " " + scen, 120);
  }

  std::optional<geoloco::test::TempDir> tmp_;
  fs::path dir_;
};

// 20 ms each way at 500 Mbit/s: the built-in check must pass (app-level RTT within
// max(10%, 0.2 ms) of 40 ms + base, iperf3 TCP within 10% of the goodput 500 Mbit/s of
// Ethernet frames carries), and its report
// must say so with the numbers. (At 1000 Mbit/s the userspace delay line on 2 shared cores
// reached 891 Mbit/s on a slow day: the test is about the check, not the machine's ceiling.)
TEST_F(WanNetns, RttAndThroughputMatchProfile) {
  const Result r = up(scenario("t20ms", "{delay_ms: 20, rate_mbit: 500}"));
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("emulation path: "), std::string::npos) << r.out;
  const json rep = read_json(state_dir() + "/check.json");
  ASSERT_EQ(rep["pairs"].size(), 1u);
  const json& p = rep["pairs"][0];
  const double rtt = p["rtt_median_ms"].get<double>();
  EXPECT_NEAR(rtt, 40.0 + p["base_rtt_ms"].get<double>(), 4.0) << r.out;
  // The target is TCP goodput at 500 Mbit/s of Ethernet frames: 1448 payload bytes of every
  // 1514 on the wire (478 Mbit/s), not the raw rate that no TCP flow reaches.
  const double expected = p["throughput_expected_mbit"].get<double>();
  EXPECT_NEAR(expected, 500.0 * 1448.0 / 1514.0, 0.5) << r.out;
  EXPECT_EQ(p["tcp_mss"].get<int>(), 1448) << r.out;
  EXPECT_NEAR(p["throughput_mbit"].get<double>(), expected, 0.1 * expected) << r.out;
  EXPECT_TRUE(p["rtt_ok"].get<bool>());
  EXPECT_TRUE(p["throughput_ok"].get<bool>());
  std::cout << "[measured] " << rep.dump() << "\n";
}

// 1% loss per direction: UDP through the link loses about 1%, and the delay line's own
// counters agree. Tolerance: 4 binomial standard deviations (+0.02 points for receiver noise).
TEST_F(WanNetns, LossVariantDropsConfiguredFraction) {
  const Result r = up(scenario("tloss", "{delay_ms: 5, rate_mbit: 1000, loss_pct: 1.0}"), "--no-check");
  ASSERT_EQ(r.rc, 0) << r.out;
  const Result u = sh(
      "ip netns exec glt-b iperf3 -s -1 -B 198.18.2.2 >/dev/null 2>&1 & "
      "for i in $(seq 100); do ip netns exec glt-b ss -Hltn \"sport = :5201\" | grep -q . && break; sleep 0.05; done; "
      "ip netns exec glt-a iperf3 -c 198.18.2.2 -u -b 40M -l 1400 -w 4M -t 3 -J",
      60);
  ASSERT_EQ(u.rc, 0) << u.out;
  const json j = json::parse(u.out);
  const double lost = j["end"]["sum"]["lost_percent"].get<double>();
  const double n = j["end"]["sum"]["packets"].get<double>();
  ASSERT_GT(n, 5000);  // 40 Mbit/s x 3 s / 1400 B = 10700 datagrams sent
  const double tol = 100.0 * 4.0 * std::sqrt(0.01 * 0.99 / n) + 0.02;
  EXPECT_NEAR(lost, 1.0, tol) << "over " << n << " datagrams";
  ASSERT_EQ(sh(kWan + "down --prefix " + kPrefix, 30).rc, 0);
  // Delay-line stats of queue 1 (a -> b), written on SIGTERM by down.
  const json st = read_json(state_dir() + ".last/delayline-1.json");
  EXPECT_EQ(st["format"], "geoloco-wan-delayline-stats");
  const double recv = st["received_loss_on"].get<double>();
  const double drop = st["dropped"].get<double>();
  ASSERT_GT(recv, 5000);
  EXPECT_NEAR(drop / recv, 0.01, 4.0 * std::sqrt(0.01 * 0.99 / recv)) << st.dump();
  EXPECT_EQ(st["flushed"].get<double>() + st["delayed"].get<double>() + drop, st["received"].get<double>());
  std::cout << "[measured] UDP loss " << lost << "% over " << n << " datagrams; delay line dropped " << drop << "/"
            << recv << "\n";
}

// The check refuses (exit 1, clear message) when the emulated link is off its profile:
// (1) the rate class is throttled to 300 Mbit/s behind its back; (2) a delay line dies: with
// --queue-bypass packets then pass undelayed (fail-open, no black hole), so the RTT is short.
TEST_F(WanNetns, CheckRefusesWhenLinkIsOffProfile) {
  ASSERT_EQ(up(scenario("toff", "{delay_ms: 10, rate_mbit: 1000}"), "--no-check").rc, 0);
  Result r = sh("ip netns exec glt-router tc class change dev s1 parent 1: classid 1:10 htb rate 300mbit ceil 300mbit");
  ASSERT_EQ(r.rc, 0) << r.out;
  r = sh(kWan + "check --prefix " + kPrefix, 90);
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("throughput"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("refusing to run"), std::string::npos) << r.out;

  ASSERT_EQ(
      sh("ip netns exec glt-router tc class change dev s1 parent 1: classid 1:10 htb rate 1000mbit ceil 1000mbit").rc,
      0);
  r = sh("kill -9 $(head -1 " + state_dir() + "/delayline-1.ready)");
  ASSERT_EQ(r.rc, 0) << r.out;
  r = sh(kWan + "check --prefix " + kPrefix, 90);
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("RTT median"), std::string::npos) << r.out;
  const json rep = read_json(state_dir() + "/check.json");
  const double rtt = rep["pairs"][0]["rtt_median_ms"].get<double>();
  EXPECT_NEAR(rtt, 10.0, 3.0) << "one direction undelayed: 10 ms instead of 20";
}

// Link cut: the router's interface toward b goes down for 2.5 s in the middle of an 8 s TCP
// transfer, then up again. Documented behaviour: TCP survives (retransmission timeouts
// bridge the gap; the connected route returns with the link), iperf3 exits 0, the transfer
// stalls during the cut and resumes afterwards. Bounded: the whole test runs under timeouts.
TEST_F(WanNetns, LinkCutMidTransferIsSurvived) {
  ASSERT_EQ(up(scenario("tcut", "{delay_ms: 10, rate_mbit: 200}"), "--no-check").rc, 0);
  const std::string out = (dir_ / "iperf.json").string();
  const auto t0 = std::chrono::steady_clock::now();
  const Result r = sh(
      "ip netns exec glt-b iperf3 -s -1 -B 198.18.2.2 >/dev/null 2>&1 & "
      "for i in $(seq 100); do ip netns exec glt-b ss -Hltn \"sport = :5201\" | grep -q . && break; sleep 0.05; done; "
      "ip netns exec glt-a iperf3 -c 198.18.2.2 -t 8 -i 0.5 -J >" +
          out +
          " & c=$!; "
          "sleep 2.5; ip -n glt-router link set s1 down; sleep 2.5; ip -n glt-router link set s1 up; "
          "wait $c",
      60);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(r.rc, 0) << r.out << "\n" << sh("cat " + out).out;
  const json j = read_json(out);
  ASSERT_FALSE(j.contains("error")) << j["error"];
  const auto& iv = j["intervals"];
  ASSERT_GE(iv.size(), 12u);
  double stalled = 1e18, after = 0, before = 0;
  for (const auto& i : iv) {
    const double start = i["sum"]["start"].get<double>();
    const double bytes = i["sum"]["bytes"].get<double>();
    if (start >= 3.0 && start < 4.5) stalled = std::min(stalled, bytes);
    if (start >= 1.0 && start < 2.0) before = std::max(before, bytes);
    if (start >= 6.5) after = std::max(after, bytes);
  }
  EXPECT_LT(stalled, 0.05 * before) << "nothing should get through while the link is down";
  EXPECT_GT(after, 0.5 * before) << "the transfer must resume after the link comes back";
  EXPECT_LT(secs, 40.0);
  std::cout << "[measured] link cut: before " << before << " B/0.5s, during " << stalled << ", after " << after
            << "; total " << secs << " s\n";
}

// tools/wan/run: one process per site and rank inside the right namespace, placeholders and
// environment filled in, CONFIG's sites mapped by name onto the scenario's (here in reverse
// order) with the --set host rewrites; the first failure's status is returned; --timeout
// bounds a hung run (124); everything is torn down after each run.
TEST_F(WanNetns, RunLaunchesPerSiteAndRankAndTearsDown) {
  const std::string scen = scenario("trun", "{delay_ms: 2, rate_mbit: 100}");
  const std::string cfg = (dir_ / "train.yaml").string();
  std::ofstream(cfg) << "sites:\n  - {name: b, host: 127.0.0.1}\n  - {name: a, host: 127.0.0.1}\n";
  const std::string out = dir_.string();
  Result r = sh(kWan + "run --prefix " + kPrefix + " --no-check --ranks-per-site 2 " + scen + " " + cfg +
                    " -- sh -c \"echo \\$GEOLOCO_WAN_ADDR {addr} {site_index} \\$(ip -4 -o addr show wan0 | wc -l) \\$*"
                    " > " +
                    out + "/{site}-{rank}\" x {hosts}",
                60);
  ASSERT_EQ(r.rc, 0) << r.out;
  auto read = [&](const std::string& f) {
    std::ifstream in(out + "/" + f);
    std::string s;
    std::getline(in, s);
    return s;
  };
  const std::string hosts = "--set sites.0.host=198.18.2.2 --set sites.1.host=198.18.1.2";
  EXPECT_EQ(read("b-0"), "198.18.2.2 198.18.2.2 0 1 " + hosts);
  EXPECT_EQ(read("b-1"), "198.18.2.2 198.18.2.2 0 1 " + hosts);
  EXPECT_EQ(read("a-0"), "198.18.1.2 198.18.1.2 1 1 " + hosts);
  EXPECT_EQ(read("a-1"), "198.18.1.2 198.18.1.2 1 1 " + hosts);
  EXPECT_EQ(sh("ip netns list | grep -q \"^glt-\"").rc, 1) << "run left namespaces behind";

  r = sh(kWan + "run --prefix " + kPrefix + " --no-check " + scen + " -- sh -c \"exit 3\"", 60);
  EXPECT_EQ(r.rc, 3) << r.out;
  EXPECT_EQ(sh("ip netns list | grep -q \"^glt-\"").rc, 1);

  const auto t0 = std::chrono::steady_clock::now();
  r = sh(kWan + "run --prefix " + kPrefix + " --no-check --timeout 2 " + scen + " -- sleep 100", 60);
  EXPECT_EQ(r.rc, 124) << r.out;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));
  EXPECT_EQ(sh("ip netns list | grep -q \"^glt-\"").rc, 1);
}

// A bring-up that fails midway tears down what it had created. Forcing the netem path gives
// a real failure on kernels without sch_netem (like the CI machines); where netem exists the
// same command must succeed and report the netem path. Either way nothing may be left behind.
TEST_F(WanNetns, FailedBringUpTearsDown) {
  const Result r = sh("GEOLOCO_WAN_PATH=netem " + kWan + "up --prefix " + kPrefix + " --no-check " +
                          scenario("tfail", "{delay_ms: 5, rate_mbit: 100}"),
                      60);
  if (r.rc == 0) {
    EXPECT_NE(r.out.find("emulation path: netem"), std::string::npos) << r.out;
    ASSERT_EQ(sh(kWan + "down --prefix " + kPrefix, 30).rc, 0);
  } else {
    EXPECT_NE(r.out.find("bring-up failed; tearing down"), std::string::npos) << r.out;
  }
  EXPECT_EQ(sh("ip netns list | grep -q \"^glt-\"").rc, 1) << "namespaces left after a failed bring-up";
  EXPECT_FALSE(fs::exists(state_dir()));
}

// Crash: the runner is killed with SIGKILL while its processes run inside the namespaces.
// The next `up` finds the stale namespaces, kills what runs in them and starts clean; `down`
// then leaves no namespace, no process and no iptables rule behind.
TEST_F(WanNetns, StaleRunIsCleanedAfterCrash) {
  const std::string scen = scenario("tcrash", "{delay_ms: 5, rate_mbit: 1000}");
  const pid_t runner = fork();
  ASSERT_GE(runner, 0);
  if (runner == 0) {
    setpgid(0, 0);
    const std::string cmd = kWan + "run --prefix " + kPrefix + " --no-check " + scen + " -- sleep 120";
    execl("/bin/bash", "bash", "-c", ("exec " + cmd + " >/dev/null 2>&1").c_str(), nullptr);
    _exit(127);
  }
  // Wait (bounded) until both site processes run.
  bool running = false;
  for (int i = 0; i < 200 && !running; ++i) {
    running = sh("[ \"$(ip netns pids glt-a 2>/dev/null | wc -l)\" -ge 1 ] && [ \"$(ip netns pids glt-b 2>/dev/null | "
                 "wc -l)\" -ge 1 ]",
                 5)
                  .rc == 0;
    if (!running) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(running) << "run did not start its processes";
  const std::string old_pids = sh("ip netns pids glt-a; ip netns pids glt-b; ip netns pids glt-router").out;
  ASSERT_EQ(kill(runner, SIGKILL), 0);
  waitpid(runner, nullptr, 0);
  // Stale: the namespaces and their processes outlive the runner.
  ASSERT_EQ(sh("ip netns list | grep -q \"^glt-router\"").rc, 0);

  const Result r = up(scen, "--no-check");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("removed 3 namespaces"), std::string::npos) << r.out;
  std::istringstream ps(old_pids);
  // Dead or a zombie (its parent, the runner, was SIGKILLed; whether init reaps it promptly
  // depends on the machine): either way it no longer runs.
  // Killed processes may take a moment to exit: wait (bounded) for each.
  for (std::string p; ps >> p;) {
    const std::string alive = "[ -e /proc/" + p + " ] && ! grep -q '^State:[[:space:]]*Z' /proc/" + p + "/status";
    bool gone = false;
    for (int i = 0; i < 50 && !gone; ++i) {
      gone = sh(alive).rc != 0;
      if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    EXPECT_TRUE(gone) << "stale process " << p << " survived";
  }

  ASSERT_EQ(sh(kWan + "down --prefix " + kPrefix, 30).rc, 0);
  EXPECT_EQ(sh("ip netns list | grep -q \"^glt-\"").rc, 1);
  EXPECT_FALSE(fs::exists(state_dir()));
  // Nothing was ever added to the root namespace's tables; make sure it stays that way.
  EXPECT_EQ(sh("iptables -t mangle -S | grep -q NFQUEUE").rc, 1);
  EXPECT_EQ(sh("ip link show | grep -q \"s[0-9]@\"").rc, 1) << "a router-side veth leaked into the root namespace";
}

}  // namespace

// `geoloco probe` through the real binary: the iperf-like pair and config mode (JSON on
// stdout, the budget YAML read by `geoloco budget`), exit codes for bad input (2), a peer that
// never shows up and a peer killed mid-probe (1, one line naming the peer).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <optional>
#include <string>
#include <thread>

#include "probe_test_util.hpp"
#include "tests/support/temp_dir.hpp"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

const std::string kBin = GEOLOCO_BIN_PATH;

std::string slurp(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// One `geoloco` process with stdout and stderr in files.
class Child {
 public:
  Child(const fs::path& dir, const std::string& name, const std::vector<std::string>& args)
      : out_(dir / (name + ".out")), err_(dir / (name + ".err")) {
    // Truncate here, before the fork: a child truncating its files itself races with the
    // parent reading them, which then sees the previous process's output (a reused name).
    std::ofstream(out_, std::ios::trunc).close();
    std::ofstream(err_, std::ios::trunc).close();
    pid_ = fork();
    if (pid_ == 0) {
      int o = ::open(out_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      int e = ::open(err_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      ::dup2(o, 1);
      ::dup2(e, 2);
      std::vector<char*> argv;
      argv.push_back(const_cast<char*>(kBin.c_str()));
      for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(kBin.c_str(), argv.data());
      _exit(127);
    }
  }
  ~Child() {
    if (pid_ > 0 && rc_ == -2) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  // Exit status, or -1 (killed by a signal); kills it after `timeout_s`.
  int wait(double timeout_s) {
    const auto end = Clock::now() + std::chrono::duration<double>(timeout_s);
    while (rc_ == -2) {
      int st = 0;
      pid_t r = ::waitpid(pid_, &st, WNOHANG);
      if (r == pid_) {
        rc_ = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        break;
      }
      if (Clock::now() > end) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, nullptr, 0);
        rc_ = -1;
        ADD_FAILURE() << "geoloco did not exit within " << timeout_s << " s; stderr: " << err();
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return rc_;
  }
  void kill9() { ::kill(pid_, SIGKILL); }
  std::string out() const { return slurp(out_); }
  std::string err() const { return slurp(err_); }

 private:
  fs::path out_, err_;
  pid_t pid_ = -1;
  int rc_ = -2;
};

class ProbeCli : public ::testing::Test {
 protected:
  void SetUp() override {
    tmp_.emplace("probe-cli");
    dir_ = tmp_->path();
    std::ofstream(dir_ / "k.psk") << "probe-cli-test-key-0123456789\n";
  }
  void TearDown() override { tmp_.reset(); }

  int run(const std::string& name, const std::vector<std::string>& args, double timeout_s = 60) {
    Child c(dir_, name, args);
    int rc = c.wait(timeout_s);
    last_out_ = c.out();
    last_err_ = c.err();
    return rc;
  }

  std::string config(int port, const std::string& transport_extra) {
    const fs::path p = dir_ / "run.yaml";
    std::ofstream(p) << "run: {name: probe-cli, seed: 3, output_dir: " << (dir_ / "out").string() << "}\n"
                     << "model: {n_layer: 2, n_head: 2, n_embd: 64, block_size: 32, vocab_size: 64}\n"
                     << "data:\n  train: {kind: synthetic, vocab: 64, branching: 3, seed: 5}\n"
                     << "train: {steps: 40, micro_batch: 4}\n"
                     << "outer: {interval: 20, compression: {codec: int4, block: 64}}\n"
                     << "sites:\n  - {name: paris, host: 127.0.0.1, port: " << port
                     << "}\n  - {name: lyon, host: 127.0.0.1, port: " << port + 10 << "}\n"
                     << "transport: {psk_file: k.psk, connect_timeout_s: 20" << transport_extra << "}\n";
    return p.string();
  }

  std::optional<geoloco::test::TempDir> tmp_;
  fs::path dir_;
  std::string last_out_, last_err_;
};

const std::vector<std::string> kQuick = {"--seconds", "1", "--count", "20", "--message-bytes", "1MiB"};

std::vector<std::string> cat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST_F(ProbeCli, ListenConnectJsonAndBudget) {
  const std::string ep = "127.0.0.1:" + std::to_string(geoloco::test::fresh_port());
  const std::string yaml = (dir_ / "budget.yaml").string();
  Child server(dir_, "server", cat({"probe", "--listen", ep, "--connections", "2", "--json"}, kQuick));
  const int rc = run("client", cat({"probe", "--connect", ep, "--connections", "2", "--json", "--out", yaml}, kQuick));
  ASSERT_EQ(rc, 0) << last_err_;
  ASSERT_EQ(server.wait(30), 0) << server.err();
  const json c = json::parse(last_out_), s = json::parse(server.out());
  EXPECT_EQ(c["format"], "geoloco-probe");
  EXPECT_EQ(c["mode"], "connect");
  EXPECT_EQ(s["mode"], "listen");
  EXPECT_EQ(c["pairs"], s["pairs"]);  // both sides report the same measurement
  EXPECT_EQ(c["pairs"].size(), 1u);
  EXPECT_GT(c["measured"]["rtt_ms"]["median"].get<double>(), 0);
  EXPECT_GT(c["measured"]["per_connection_gbps"].get<double>(), 0);
  EXPECT_EQ(c["measured"]["connections"], 2);
  EXPECT_NE(last_err_.find("probe: wrote " + yaml), std::string::npos) << last_err_;

  // The budget reads the file; the standalone file has no model, so --params and --step-time.
  ASSERT_EQ(run("budget", {"budget", "--from", yaml, "--params", "124M", "--step-time", "0.5", "--json"}), 0)
      << last_err_ << slurp(yaml);
  const json b = json::parse(last_out_);
  EXPECT_DOUBLE_EQ(b["inputs"]["rtt_s"].get<double>(), c["measured"]["rtt_ms"]["median"].get<double>() * 1e-3);
  EXPECT_EQ(b["inputs"]["rtt_source"], "measured.rtt_ms.median");
  EXPECT_DOUBLE_EQ(b["inputs"]["retransmit_pct"].get<double>(), c["measured"]["retransmit_pct"].get<double>());
  // Without them it says what is missing (exit 2).
  EXPECT_EQ(run("budget2", {"budget", "--from", yaml}), 2);
}

TEST_F(ProbeCli, ConfigModeWithTheEmulatorAndABudgetFromTheRunConfig) {
  const int port = geoloco::test::fresh_port();
  const std::string cfg = config(port, ", emulate: {delay_ms: 10, rate_mbit: 300}");
  const std::string yaml = (dir_ / "paris.yaml").string();
  Child lyon(dir_, "lyon", cat({"probe", cfg, "--site", "lyon", "--json", "--connections", "2"}, kQuick));
  ASSERT_EQ(run("paris", cat({"probe", cfg, "--site", "paris", "--connections", "2", "--out", yaml}, kQuick)), 0)
      << last_err_;
  ASSERT_EQ(lyon.wait(30), 0) << lyon.err();
  // paris printed the table, lyon the JSON.
  EXPECT_NE(last_out_.find("paris -> lyon"), std::string::npos) << last_out_;
  EXPECT_NE(last_out_.find("transport.emulate is on"), std::string::npos) << last_out_;
  const json l = json::parse(lyon.out());
  EXPECT_EQ(l["mode"], "config");
  EXPECT_EQ(l["self"], "lyon");
  ASSERT_EQ(l["pairs"].size(), 1u);
  EXPECT_EQ(l["pairs"][0]["initiator"], "paris");  // the lower-index site initiates
  const double rtt = l["pairs"][0]["rtt_ms"]["median"];
  EXPECT_GE(rtt, 20.0);
  EXPECT_LT(rtt, 26.0);
  EXPECT_NEAR(l["pairs"][0]["single"]["gbps"].get<double>(), 0.3, 0.3 * 0.15);

  // The file carries the config's model, codec and schedule: only the step time is missing.
  const std::string text = slurp(yaml);
  EXPECT_NE(text.find("compression: {bits: 4, block: 64}"), std::string::npos) << text;
  EXPECT_NE(text.find("H: 20"), std::string::npos) << text;
  EXPECT_NE(text.find("emulated figures"), std::string::npos) << text;
  ASSERT_EQ(run("budget", {"budget", "--from", yaml, "--step-time", "0.2", "--json"}), 0) << last_err_ << text;
  const json b = json::parse(last_out_);
  EXPECT_EQ(b["inputs"]["H"], 20);
  EXPECT_EQ(b["inputs"]["bits"], 4);
  EXPECT_DOUBLE_EQ(b["inputs"]["rtt_s"].get<double>(), rtt * 1e-3);
  EXPECT_GT(b["inputs"]["params"].get<double>(), 50000);
}

TEST_F(ProbeCli, BadInputExitsTwo) {
  const int port = geoloco::test::fresh_port();
  const std::string cfg = config(port, "");
  std::ofstream(dir_ / "broken.yaml") << "sites: [unclosed\n";
  std::ofstream(dir_ / "unknown.yaml") << slurp(cfg) << "bogus_key: 1\n";
  struct Case {
    std::vector<std::string> args;
    std::string says;
  };
  const std::vector<Case> cases = {
      {{"probe"}, "give exactly one of"},
      {{"probe", "--listen", "127.0.0.1:1", "--connect", "127.0.0.1:2"}, "give exactly one of"},
      {{"probe", "--connect", "127.0.0.1"}, "expected ADDR:PORT"},
      {{"probe", "--connect", "no-such-host.invalid:7000"}, "does not resolve"},
      {{"probe", "--connect", "127.0.0.1:99999"}, "not in 1..65535"},
      {{"probe", "--connect", "127.0.0.1:7000", "--count", "0"}, "--count 0"},
      {{"probe", "--connect", "127.0.0.1:7000", "--connections", "0"}, "--connections 0"},
      {{"probe", "--connect", "127.0.0.1:7000", "--message-bytes", "12"}, "--message-bytes 12"},
      {{"probe", "--connect", "127.0.0.1:7000", "--psk-file", (dir_ / "nope").string()}, "nope"},
      {{"probe", cfg}, "needs --site"},
      {{"probe", cfg, "--site", "rome"}, "--site 'rome' is not a site of the config (sites: paris, lyon)"},
      {{"probe", (dir_ / "broken.yaml").string(), "--site", "paris"}, "broken.yaml"},
      {{"probe", (dir_ / "unknown.yaml").string(), "--site", "paris"}, "bogus_key"},
      {{"probe", (dir_ / "missing.yaml").string(), "--site", "paris"}, "missing.yaml"},
  };
  for (const auto& c : cases) {
    const auto t0 = Clock::now();
    EXPECT_EQ(run("bad", c.args, 20), 2) << c.args.back() << ": " << last_err_;
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 10.0) << c.args.back();
    EXPECT_NE(last_err_.find(c.says), std::string::npos) << "expected '" << c.says << "' in: " << last_err_;
    EXPECT_EQ(last_out_, "");
  }
}

TEST_F(ProbeCli, PeerThatNeverShowsUpExitsOneNamingIt) {
  const int port = geoloco::test::fresh_port();
  const std::string ep = "127.0.0.1:" + std::to_string(port);
  auto t0 = Clock::now();
  EXPECT_EQ(run("connect", {"probe", "--connect", ep, "--timeout", "1.5"}), 1);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 8.0);
  EXPECT_NE(last_err_.find("geoloco: failed: probe: no probe responder answered at " + ep + " within 1.5 s"),
            std::string::npos)
      << last_err_;
  EXPECT_EQ(last_err_.find('\n'), last_err_.size() - 1) << last_err_;  // one line

  EXPECT_EQ(run("listen", {"probe", "--listen", ep, "--timeout", "1", "--quiet"}), 1);
  EXPECT_NE(last_err_.find("no initiator connected to " + ep + " within 1 s"), std::string::npos) << last_err_;

  // Config mode: the missing site is named with its address.
  const std::string cfg = config(port + 40, "");
  EXPECT_EQ(run("site", {"probe", cfg, "--site", "paris", "--timeout", "1.5", "--quiet"}), 1);
  EXPECT_NE(last_err_.find("lyon/0 (127.0.0.1:" + std::to_string(port + 50) + ")"), std::string::npos) << last_err_;
}

TEST_F(ProbeCli, PeerKilledMidProbeExitsOneNamingIt) {
  const std::string ep = "127.0.0.1:" + std::to_string(geoloco::test::fresh_port());
  for (const bool kill_server : {true, false}) {
    Child server(dir_, "server", {"probe", "--listen", ep, "--seconds", "30", "--message-bytes", "1MiB"});
    Child client(dir_, "client", {"probe", "--connect", ep, "--seconds", "30", "--message-bytes", "1MiB"});
    Child& victim = kill_server ? server : client;
    Child& survivor = kill_server ? client : server;
    // Wait until the streams run (the client reports the RTT first), then kill one side.
    for (int i = 0; i < 500 && client.err().find("rtt to") == std::string::npos; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ASSERT_NE(client.err().find("rtt to"), std::string::npos) << client.err();
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    victim.kill9();
    const auto t0 = Clock::now();
    EXPECT_EQ(survivor.wait(20), 1) << survivor.err();
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 10.0);
    const std::string e = survivor.err();
    EXPECT_NE(e.find("geoloco: failed: probe with "), std::string::npos) << e;
    EXPECT_NE(e.find(kill_server ? "server/0 (127.0.0.1:" : "client/0"), std::string::npos) << e;
    EXPECT_NE(e.find("single-connection stream"), std::string::npos) << e;
    victim.wait(5);
  }
}

}  // namespace

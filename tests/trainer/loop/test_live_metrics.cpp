// run.metrics_port: each rank's Prometheus endpoint serves what the rank logged, as one
// consistent snapshot; a port in use is an InputError at start; during a two-site run the
// scraped values equal the metrics.jsonl lines of the same steps.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <thread>

#include "tests/support/ports.hpp"
#include "tests/support/temp_dir.hpp"
#include "core/error.hpp"
#include "core/net.hpp"
#include "trainer/loop/live_metrics.hpp"
#include "trainer/loop/run_config.hpp"

using namespace geoloco;
using geoloco::test::TempDir;
using Clock = std::chrono::steady_clock;

namespace {

// GET /metrics; "" when nothing answers.
std::string scrape(int port) {
  auto c = net::try_connect("127.0.0.1", port, Clock::now() + std::chrono::milliseconds(300));
  if (!c.fd) return "";
  const std::string req = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  if (!net::send_all(c.fd.get(), req.data(), req.size(), Clock::now() + std::chrono::seconds(2)).ok()) return "";
  std::string out;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(c.fd.get(), buf, sizeof buf);
    if (n <= 0) break;
    out.append(buf, size_t(n));
  }
  return out;
}

// metric name + labels text -> value, from the Prometheus text format.
std::map<std::string, double> parse(const std::string& text) {
  std::map<std::string, double> out;
  std::istringstream in(text);
  static const std::regex line_re(R"(^([a-z_]+)\{([^}]*)\} ([-+0-9.eE]+|NaN))");
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (std::regex_search(line, m, line_re)) {
      std::string labels = m[2];
      std::string key = m[1];
      // Keep only the peer label (run/site/rank are the same for one endpoint).
      std::smatch p;
      if (std::regex_search(labels, p, std::regex(R"(peer="([^"]*)\")"))) key += "{" + std::string(p[1]) + "}";
      out[key] = std::stod(m[3]);
    }
  }
  return out;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

TEST(LiveMetrics, ServesWhatTheRankLoggedAndNothingMadeUp) {
  const int port = test::fresh_port();
  trainer::LiveMetrics m("127.0.0.1", port, {"demo", "paris", 0}, 300, 2);
  auto before = parse(scrape(port));
  EXPECT_EQ(before.count("geoloco_loss"), 0u) << "no loss before the first logged step";
  EXPECT_EQ(before.at("geoloco_steps"), 300);
  EXPECT_EQ(before.at("geoloco_running"), 1);
  m.on_line({{"step", 25}, {"loss", 2.5}, {"tokens_per_s", 1200.0}, {"tokens", 4000}, {"elapsed_s", 3.0}});
  m.on_line({{"step", 50}, {"loss", 2.25}, {"val_loss", 2.75}, {"compute_utilization", 0.93}, {"sync_s", 0.125}});
  m.on_round({{"round", 1},
              {"sync_s", 0.125},
              {"compression_ratio", 3.9},
              {"plan_epoch", 0},
              {"peers", {{{"site", "lyon"}, {"rank", 0}, {"bytes_sent", 1000}, {"bytes_received", 900}}}}});
  const std::string text = scrape(port);
  EXPECT_NE(text.find("geoloco_step{run=\"demo\",site=\"paris\",rank=\"0\"} 50"), std::string::npos) << text;
  EXPECT_NE(text.find("# TYPE geoloco_wan_bytes_sent_total counter"), std::string::npos) << text;
  auto v = parse(text);
  EXPECT_EQ(v.at("geoloco_loss"), 2.25);
  EXPECT_EQ(v.at("geoloco_validation_loss"), 2.75);
  EXPECT_EQ(v.at("geoloco_tokens_per_second"), 1200);
  EXPECT_EQ(v.at("geoloco_compute_utilization_ratio"), 0.93);
  EXPECT_EQ(v.at("geoloco_last_sync_seconds"), 0.125);
  EXPECT_EQ(v.at("geoloco_outer_rounds_total"), 1);
  EXPECT_EQ(v.at("geoloco_compression_ratio"), 3.9);
  EXPECT_EQ(v.at("geoloco_round_members"), 2);
  EXPECT_EQ(v.at("geoloco_wan_bytes_sent_total{lyon/0}"), 1000);
  EXPECT_EQ(v.at("geoloco_wan_bytes_received_total{lyon/0}"), 900);
  m.on_end(true);
  v = parse(scrape(port));
  EXPECT_EQ(v.at("geoloco_running"), 0);
  EXPECT_EQ(v.at("geoloco_completed"), 1);
}

TEST(LiveMetrics, APortInUseIsAnInputErrorNamingTheKey) {
  const int port = test::fresh_port();
  Fd taken = net::listen_tcp("127.0.0.1", port);
  try {
    trainer::LiveMetrics m("127.0.0.1", port, {"r", "s", 0}, 10, 1);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("run.metrics_port"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(port)), std::string::npos) << e.what();
  }
}

TEST(LiveMetrics, ConfigKeysAreChecked) {
  const char* base =
      "model: {n_layer: 1, n_head: 2, n_embd: 32, block_size: 16, vocab_size: 64}\n"
      "data:\n  train: {kind: synthetic, vocab: 64}\n";
  auto err = [&](const std::string& run) -> std::string {
    try {
      trainer::parse_run_config(config::load_string(run + base, "c.yaml"));
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(err("run: {metrics_port: 70000}\n").find("metrics_port"), std::string::npos);
  EXPECT_NE(err("run: {metrics_port: -1}\n").find("metrics_port"), std::string::npos);
  EXPECT_EQ(err("run: {metrics_port: 9400}\n"), "");
  const std::string two_sites = "sites:\n  - {name: a, port: 7000}\n  - {name: b, port: 7100}\n";
  EXPECT_NE(err("run: {metrics_port: 65535}\n" + two_sites).find("at most 65534"), std::string::npos)
      << err("run: {metrics_port: 65535}\n" + two_sites);
}

// The binary: two sites, rank 0 of paris (global rank 0) scraped while it trains; every
// scraped (step, loss, tokens/s) equals paris's metrics.jsonl line of that step.
TEST(LiveMetrics, ScrapedDuringATwoSiteRunMatchesMetricsJsonl) {
  TempDir d("live-metrics");
  const int port = test::fresh_port();
  const int mport = port + 40;
  d.file("k.psk", "0123456789abcdef-test-key");
  const std::string out = (d.path() / "out").string();
  const std::string cfg =
      d.file("c.yaml", "run: {name: live, seed: 3, output_dir: " + out + ", metrics_port: " + std::to_string(mport) +
                           "}\nmodel: {n_layer: 1, n_head: 2, n_embd: 32, block_size: 16, vocab_size: 64}\n"
                           "data:\n  train: {kind: synthetic, vocab: 64, branching: 3, seed: 5}\n"
                           "train: {steps: 120, micro_batch: 2, log_every: 2, eval_every: 20}\n"
                           "outer: {interval: 10, compression: {codec: int8}}\n"
                           "sites:\n  - {name: paris, port: " +
                           std::to_string(port) + "}\n  - {name: lyon, port: " + std::to_string(port + 10) +
                           "}\ntransport: {psk_file: k.psk, connect_timeout_s: 20, emulate: {delay_ms: 60}}\n");
  const pid_t pid = fork();
  if (pid == 0) {
    FILE* f = freopen(d.file("launch.log").c_str(), "w", stdout);
    (void)f;
    dup2(fileno(stdout), 2);
    const std::string bin = std::string(GEOLOCO_BINARY_DIR) + "/geoloco";
    execl(bin.c_str(), bin.c_str(), "launch", cfg.c_str(), (char*)nullptr);
    _exit(127);
  }
  std::vector<std::map<std::string, double>> scraped;
  int status = 0;
  const auto deadline = Clock::now() + std::chrono::seconds(120);
  while (Clock::now() < deadline) {
    if (waitpid(pid, &status, WNOHANG) == pid) break;
    auto v = parse(scrape(mport));
    if (v.count("geoloco_loss")) scraped.push_back(v);
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << slurp(d.file("launch.log"));
  ASSERT_GE(scraped.size(), 3u) << "the endpoint answered too rarely during the run";
  std::map<int64_t, nlohmann::json> lines;
  std::istringstream in(slurp(out + "/sites/paris/metrics.jsonl"));
  for (std::string l; std::getline(in, l);) {
    auto j = nlohmann::json::parse(l);
    lines[j["step"].get<int64_t>()] = j;
  }
  int64_t prev = 0;
  for (const auto& v : scraped) {
    const auto step = static_cast<int64_t>(v.at("geoloco_step"));
    ASSERT_TRUE(lines.count(step)) << "step " << step;
    EXPECT_GE(step, prev) << "steps only move forward";
    prev = step;
    // The text format carries 16 significant digits; metrics.jsonl the shortest exact form.
    const double loss = lines[step]["loss"].get<double>(), tps = lines[step]["tokens_per_s"].get<double>();
    EXPECT_NEAR(v.at("geoloco_loss"), loss, 1e-12 * std::abs(loss)) << "step " << step;
    EXPECT_NEAR(v.at("geoloco_tokens_per_second"), tps, 1e-12 * std::abs(tps)) << "step " << step;
  }
  // WAN bytes per peer appeared once a round had finished.
  EXPECT_GT(scraped.back().count("geoloco_wan_bytes_sent_total{lyon/0}"), 0u);
}

// docs/grafana/geoloco.json imports as is: a dashboard with a Prometheus input, and every
// metric its queries name is one a rank serves.
TEST(LiveMetrics, TheGrafanaDashboardQueriesOnlyServedMetrics) {
  trainer::LiveMetrics m("127.0.0.1", test::fresh_port(), {"r", "s", 0}, 10, 2);
  m.on_line({{"step", 1},
             {"loss", 1.0},
             {"val_loss", 1.0},
             {"tokens_per_s", 1.0},
             {"tokens", 1},
             {"compute_utilization", 1.0},
             {"exposed_wait_s", 0.0},
             {"sync_s", 0.1},
             {"elapsed_s", 1.0}});
  m.on_round({{"compression_ratio", 4.0}, {"plan_epoch", 0}, {"peers", {{{"site", "b"}, {"rank", 0}}}}});
  const std::string served = m.scrape_text();
  const auto dash = nlohmann::json::parse(slurp(std::string(GEOLOCO_SOURCE_DIR) + "/docs/grafana/geoloco.json"));
  ASSERT_TRUE(dash.contains("__inputs"));
  EXPECT_EQ(dash["__inputs"][0]["pluginId"], "prometheus");
  ASSERT_GE(dash["panels"].size(), 8u);
  int queries = 0;
  static const std::regex name_re(R"(geoloco_[a-z_]+)");
  for (const auto& p : dash["panels"])
    for (const auto& t : p["targets"]) {
      const std::string expr = t["expr"];
      for (std::sregex_iterator it(expr.begin(), expr.end(), name_re), end; it != end; ++it) {
        ++queries;
        EXPECT_NE(served.find("# TYPE " + it->str() + " "), std::string::npos) << it->str() << " in " << expr;
      }
    }
  EXPECT_GE(queries, 12);
}

// Outer-sync goodput between two sites on loopback: site "a" (parent process) sends a
// pseudo-gradient of S bytes to site "b" (forked child) through geoloco::transport, timed
// from the moment b's recv is posted and a sends, to the moment a learns b verified every
// byte (a 1-byte "done" message). Prints JSON; bench/transport/run.sh puts it next to
// ucx_perftest tag_bw measured in the same run.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>

#include <spdlog/sinks/stdout_color_sinks.h>

#include "trainer/core/log.hpp"
#include "transport/transport.hpp"

using namespace geoloco::transport;
using Clock = std::chrono::steady_clock;

namespace {

struct Options {
  std::vector<int> sizes_mib = {16, 64, 256};
  int reps = 5;
  int lanes = 1;
  int chunk_mib = 4;
  int inflight = 8;
  bool exchange = false;  // both directions at once (what an outer sync does)
};

TransportConfig make_config(const Options& o) {
  TransportConfig c;
  c.psk = std::vector<uint8_t>(32, 0x42);  // benchmark-only key
  c.connect_timeout_s = 30;
  c.transfer_timeout_s = 60;
  c.lanes = o.lanes;
  c.chunk_bytes = static_cast<uint64_t>(o.chunk_mib) << 20;
  c.inflight_chunks = o.inflight;
  return c;
}

Identity ident(const std::string& site) { return Identity{site, 0, "bench", 1}; }

// Runs one side. Returns per-size seconds (only meaningful on "a").
std::vector<std::vector<double>> run_side(bool is_a, const Options& o, int read_fd, int write_fd) {
  Transport t(make_config(o), ident(is_a ? "a" : "b"));
  int port = t.listen("127.0.0.1", 0);
  if (::write(write_fd, &port, sizeof(port)) != sizeof(port)) throw std::runtime_error("pipe write");
  int peer_port = 0;
  if (::read(read_fd, &peer_port, sizeof(peer_port)) != sizeof(peer_port)) throw std::runtime_error("pipe read");
  t.connect({PeerInfo{is_a ? "b" : "a", 0, "127.0.0.1", peer_port}});
  size_t max_bytes = static_cast<size_t>(*std::max_element(o.sizes_mib.begin(), o.sizes_mib.end())) << 20;
  std::vector<uint8_t> payload(max_bytes), dest(max_bytes);
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<uint8_t>(i * 2654435761u >> 24);
  std::vector<std::vector<double>> secs;
  uint64_t round = 0;
  uint8_t one = 1, got = 0;
  for (int mib : o.sizes_mib) {
    size_t n = static_cast<size_t>(mib) << 20;
    secs.emplace_back();
    for (int r = -1; r < o.reps; ++r, ++round) {  // r == -1: warm-up
      auto data = std::span<const uint8_t>(payload.data(), n);
      auto into = std::span<uint8_t>(dest.data(), n);
      if (is_a) {
        t.recv(0, FrameKind::kControl, round, 0, std::span<uint8_t>(&got, 1)).wait();  // b is ready
        auto t0 = Clock::now();
        RecvHandle back;
        if (o.exchange) back = t.recv(0, FrameKind::kPseudoGradient, round, 0, into);
        auto s = t.send(0, FrameKind::kPseudoGradient, round, 0, data);
        auto done = t.recv(0, FrameKind::kControl, round, 1, std::span<uint8_t>(&got, 1));
        s.wait();
        if (o.exchange) back.wait();
        done.wait();
        double dt = std::chrono::duration<double>(Clock::now() - t0).count();
        if (r >= 0) secs.back().push_back(dt);
      } else {
        auto rh = t.recv(0, FrameKind::kPseudoGradient, round, 0, into);
        t.send(0, FrameKind::kControl, round, 0, std::span<const uint8_t>(&one, 1)).wait();
        SendHandle s;
        if (o.exchange) s = t.send(0, FrameKind::kPseudoGradient, round, 0, data);
        rh.wait();
        if (o.exchange) s.wait();
        t.send(0, FrameKind::kControl, round, 1, std::span<const uint8_t>(&one, 1)).wait();
        if (!std::equal(data.begin(), data.end(), into.begin())) throw std::runtime_error("payload mismatch");
      }
    }
  }
  return secs;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"geoloco transport goodput benchmark (two sites on loopback)"};
  app.add_option("--sizes-mib", o.sizes_mib, "payload sizes in MiB");
  app.add_option("--reps", o.reps, "timed repetitions per size (after one warm-up)");
  app.add_option("--lanes", o.lanes, "endpoints per peer pair");
  app.add_option("--chunk-mib", o.chunk_mib, "frame chunk size in MiB");
  app.add_option("--inflight", o.inflight, "chunks in flight per peer");
  app.add_flag("--exchange", o.exchange, "both sites send at once (per-direction goodput)");
  CLI11_PARSE(app, argc, argv);
  // stdout carries the JSON only.
  spdlog::set_default_logger(spdlog::stderr_color_mt("bench"));
  spdlog::set_level(spdlog::level::warn);
  int a_to_b[2], b_to_a[2];
  if (::pipe(a_to_b) != 0 || ::pipe(b_to_a) != 0) return 1;
  pid_t pid = ::fork();
  if (pid == 0) {
    try {
      run_side(false, o, a_to_b[0], b_to_a[1]);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "site b: %s\n", e.what());
      _exit(1);
    }
    _exit(0);
  }
  std::vector<std::vector<double>> secs;
  try {
    secs = run_side(true, o, b_to_a[0], a_to_b[1]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "site a: %s\n", e.what());
    ::kill(pid, SIGKILL);
    return 1;
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "site b failed\n");
    return 1;
  }
  nlohmann::json out;
  out["lanes"] = o.lanes;
  out["chunk_mib"] = o.chunk_mib;
  out["inflight"] = o.inflight;
  out["mode"] = o.exchange ? "exchange" : "one-way";
  for (size_t i = 0; i < o.sizes_mib.size(); ++i) {
    auto v = secs[i];
    std::sort(v.begin(), v.end());
    double median = v[v.size() / 2];
    double mib = o.sizes_mib[i];
    out["results"].push_back({{"size_mib", o.sizes_mib[i]},
                              {"seconds", secs[i]},
                              {"goodput_mib_s_median", mib / median},
                              {"goodput_mib_s_best", mib / v.front()}});
  }
  std::cout << out.dump() << std::endl;
  return 0;
}

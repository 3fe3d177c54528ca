// Outer-sync goodput between two sites: site "a" sends a pseudo-gradient of S bytes to site
// "b" through geoloco::transport, timed from the moment b's recv is posted and a sends, to the
// moment a learns b verified every byte (a 1-byte "done" message). Prints JSON (on "a").
//
// Loopback (default): a is this process, b a forked child; bench/transport/run.sh puts it next
// to ucx_perftest tag_bw measured in the same run. Across a real path (e.g. tools/wan's
// namespaces): run `--role a --listen ADDR:PORT --peer ADDR:PORT` and `--role b ...` in the two
// places; bench/transport/wan.sh does that to compare eager_bytes settings on emulated WAN links.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <thread>
#include <tuple>

#include <spdlog/sinks/stdout_color_sinks.h>

#include "core/log.hpp"
#include "transport/ucx/ucx_transport.hpp"

using namespace geoloco::transport;
using Clock = std::chrono::steady_clock;

namespace {

struct Options {
  std::vector<int> sizes_mib = {16, 64, 256};
  std::vector<int> sizes_kib;  // overrides sizes_mib when given
  int eager_kib = 8 * 1024;    // transport.eager_bytes / 1024
  int gap_ms = 0;              // idle time before each transfer (as between outer syncs)
  std::string role;            // "a" | "b": network mode (no fork)
  std::string listen = "127.0.0.1:0", peer;
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
  c.eager_bytes = static_cast<uint64_t>(o.eager_kib) << 10;
  c.validate();
  return c;
}

Identity ident(const std::string& site) { return Identity{site, 0, "bench", 1}; }

std::vector<size_t> sizes_bytes(const Options& o) {
  std::vector<size_t> v;
  if (!o.sizes_kib.empty())
    for (int k : o.sizes_kib) v.push_back(static_cast<size_t>(k) << 10);
  else
    for (int m : o.sizes_mib) v.push_back(static_cast<size_t>(m) << 20);
  return v;
}

std::pair<std::string, int> host_port(const std::string& s) {
  const auto colon = s.rfind(':');
  if (colon == std::string::npos) throw std::invalid_argument("expected ADDR:PORT, got '" + s + "'");
  return {s.substr(0, colon), std::stoi(s.substr(colon + 1))};
}

// Runs one side. Returns per-size seconds (only meaningful on "a"). Loopback mode exchanges
// the kernel-picked ports over the pipes; network mode takes --listen/--peer.
std::vector<std::vector<double>> run_side(bool is_a, const Options& o, int read_fd, int write_fd) {
  ucx::UcxTransport t(make_config(o), ident(is_a ? "a" : "b"));
  PeerInfo peer{is_a ? "b" : "a", 0, "127.0.0.1", 0};
  if (o.role.empty()) {
    int port = t.listen("127.0.0.1", 0);
    if (::write(write_fd, &port, sizeof(port)) != sizeof(port)) throw std::runtime_error("pipe write");
    if (::read(read_fd, &peer.port, sizeof(peer.port)) != sizeof(peer.port)) throw std::runtime_error("pipe read");
  } else {
    const auto [host, port] = host_port(o.listen);
    t.listen(host, port);
    std::tie(peer.host, peer.port) = host_port(o.peer);
  }
  t.connect({peer});
  const auto sizes = sizes_bytes(o);
  const size_t max_bytes = *std::max_element(sizes.begin(), sizes.end());
  std::vector<uint8_t> pattern(max_bytes);
  for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<uint8_t>(i * 2654435761u >> 24);
  const auto one = make_payload({1});
  std::vector<std::vector<double>> secs;
  uint64_t round = 0;
  for (const size_t n : sizes) {
    secs.emplace_back();
    // One payload per size, and one receive buffer moved into every receive and taken back.
    const auto data =
        make_payload(std::vector<uint8_t>(pattern.begin(), pattern.begin() + static_cast<std::ptrdiff_t>(n)));
    std::vector<uint8_t> into(n);
    for (int r = -1; r < o.reps; ++r, ++round) {  // r == -1: warm-up
      if (is_a) {
        t.recv(0, FrameKind::kControl, round, 0, size_t{1}).wait();  // b is ready
        if (o.gap_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(o.gap_ms));
        auto t0 = Clock::now();
        RecvHandle back;
        if (o.exchange) back = t.recv(0, FrameKind::kPseudoGradient, round, 0, std::move(into));
        auto s = t.send(0, FrameKind::kPseudoGradient, round, 0, data);
        auto done = t.recv(0, FrameKind::kControl, round, 1, size_t{1});
        s.wait();
        if (o.exchange) back.wait();
        done.wait();
        double dt = std::chrono::duration<double>(Clock::now() - t0).count();
        if (r >= 0) secs.back().push_back(dt);
        if (o.exchange) into = back.take();
      } else {
        auto rh = t.recv(0, FrameKind::kPseudoGradient, round, 0, std::move(into));
        t.send(0, FrameKind::kControl, round, 0, one).wait();
        SendHandle s;
        if (o.exchange) s = t.send(0, FrameKind::kPseudoGradient, round, 0, data);
        rh.wait();
        if (o.exchange) s.wait();
        t.send(0, FrameKind::kControl, round, 1, one).wait();
        into = rh.take();
        if (into != *data) throw std::runtime_error("payload mismatch");
      }
      into.resize(n);
    }
  }
  return secs;
}

nlohmann::json report(const Options& o, const std::vector<std::vector<double>>& secs) {
  nlohmann::json out;
  out["lanes"] = o.lanes;
  out["chunk_mib"] = o.chunk_mib;
  out["inflight"] = o.inflight;
  out["eager_bytes"] = static_cast<uint64_t>(o.eager_kib) << 10;
  out["gap_ms"] = o.gap_ms;
  out["mode"] = o.exchange ? "exchange" : "one-way";
  out["path"] = o.role.empty() ? "loopback" : o.listen + " -> " + o.peer;
  const auto sizes = sizes_bytes(o);
  for (size_t i = 0; i < sizes.size(); ++i) {
    auto v = secs[i];
    std::sort(v.begin(), v.end());
    const double median = v[v.size() / 2];
    const double mib = static_cast<double>(sizes[i]) / (1 << 20);
    out["results"].push_back({{"size_bytes", sizes[i]},
                              {"size_mib", mib},
                              {"seconds", secs[i]},
                              {"seconds_median", median},
                              {"goodput_mib_s_median", mib / median},
                              {"goodput_mib_s_best", mib / v.front()}});
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"geoloco transport goodput benchmark (two sites: loopback, or --role across a path)"};
  app.add_option("--sizes-mib", o.sizes_mib, "payload sizes in MiB");
  app.add_option("--sizes-kib", o.sizes_kib, "payload sizes in KiB (instead of --sizes-mib)");
  app.add_option("--reps", o.reps, "timed repetitions per size (after one warm-up)")->check(CLI::Range(1, 100000));
  app.add_option("--lanes", o.lanes, "endpoints per peer pair");
  app.add_option("--chunk-mib", o.chunk_mib, "frame chunk size in MiB");
  app.add_option("--inflight", o.inflight, "chunks in flight per peer");
  app.add_option("--eager-kib", o.eager_kib, "transport.eager_bytes in KiB (0: UCX decides every chunk)")
      ->check(CLI::Range(0, 64 * 1024));
  app.add_option("--gap-ms", o.gap_ms, "idle milliseconds before each transfer")->check(CLI::Range(0, 600000));
  app.add_flag("--exchange", o.exchange, "both sites send at once (per-direction goodput)");
  app.add_option("--role", o.role, "a | b: network mode, one side per process")->check(CLI::IsMember({"a", "b"}));
  app.add_option("--listen", o.listen, "network mode: this side's ADDR:PORT");
  app.add_option("--peer", o.peer, "network mode: the other side's ADDR:PORT");
  CLI11_PARSE(app, argc, argv);
  // stdout carries the JSON only.
  spdlog::set_default_logger(spdlog::stderr_color_mt("bench"));
  spdlog::set_level(spdlog::level::warn);
  if (!o.role.empty()) {
    if (o.peer.empty()) {
      std::fprintf(stderr, "bench_transport: --role needs --listen and --peer\n");
      return 2;
    }
    try {
      const auto secs = run_side(o.role == "a", o, -1, -1);
      if (o.role == "a") std::cout << report(o, secs).dump() << std::endl;
      return 0;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "site %s: %s\n", o.role.c_str(), e.what());
      return 1;
    }
  }
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
  std::cout << report(o, secs).dump() << std::endl;
  return 0;
}

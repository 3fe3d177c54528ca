// Recovery time of a join (elastic sites): D donor sites serve a committed state of P
// parameters (global weights + Nesterov momentum, packed as Diloco::serve_joiners does) to a
// joining site over UCX on loopback; the joiner fetches it from every donor at once in
// checksummed chunks and verifies it (outer/state_transfer.hpp, the code a real join runs).
// The peer figure, in the same processes and alternated with the join: the same bytes sent
// from one donor to the joiner as one transport message (a raw copy of the state, no chunks,
// manifests or hashes). Every site is its own process (fork), as in a run. Prints one JSON
// document: per (P, D) the median of the reps for both and their ratio.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <random>
#include <thread>

#include "outer_optimizer/join_wire.hpp"
#include "outer_optimizer/state_transfer.hpp"
#include "core/safetensors.hpp"
#include "core/hash.hpp"
#include "trainer/loop/run_config.hpp"
#include "transport/ucx/ucx_transport.hpp"

using namespace geoloco;
using Clock = std::chrono::steady_clock;

namespace {

struct Options {
  std::vector<int64_t> params = {1'000'000, 10'000'000, 100'000'000};
  std::vector<int> donors = {1, 2, 3};
  int reps = 5;
  int64_t chunk_bytes = 4 << 20;  // outer.join_chunk_bytes' default
  std::string out;
  bool allow_load = false;
  // An emulated WAN link (transport.emulate: the sender-side delay line, every site pair):
  // one-way delay and per pair rate cap; 0, 0: plain loopback.
  double delay_ms = 0, rate_mbit = 0;
};

const char* kNames[] = {"joiner", "d1", "d2", "d3"};

transport::TransportConfig transport_config(const Options& o) {
  transport::TransportConfig c;
  c.emulate.delay_ms = o.delay_ms;
  c.emulate.rate_mbit = o.rate_mbit;
  c.psk = std::vector<uint8_t>(32, 0x42);  // benchmark-only key
  c.connect_timeout_s = 30;
  c.transfer_timeout_s = 60;
  c.validate();
  return c;
}

// The state a donor serves: P global weights and P momentum values, fixed by the seed.
std::vector<uint8_t> make_state(int64_t params) {
  std::vector<float> global(static_cast<size_t>(params)), momentum(static_cast<size_t>(params));
  std::mt19937 rng(7);
  std::normal_distribution<float> n(0.0f, 0.02f);
  for (auto& x : global) x = n(rng);
  for (size_t i = 0; i < momentum.size(); ++i) momentum[i] = 0.1f * global[(i * 7919) % global.size()];
  std::vector<geoloco::TensorWrite> t = {geoloco::f32_tensor("outer.global", {params}, global),
                                         geoloco::f32_tensor("outer.opt_a", {params}, momentum)};
  return geoloco::encode_safetensors(t, {{"outer.round", "1"}, {"geoloco_step", "1"}});
}

struct Pipes {
  int to_child[2], to_parent[2];
};

// One site's process (or the parent, the joiner): listen, learn every site's port, connect to
// all, then the measurements. Returns {join seconds, raw seconds, bytes} on the joiner.
struct RepResult {
  double join_s = 0, raw_s = 0;
  uint64_t bytes = 0, state_bytes = 0;
};

RepResult run_site(int site, int sites, const Options& o, int64_t params, bool raw_first, const std::vector<int>& wfd,
                   const std::vector<int>& rfd) {
  transport::ucx::UcxTransport t(transport_config(o), transport::Identity{kNames[site], 0, "bench", 1});
  const int port = t.listen("127.0.0.1", 0);
  std::vector<int> ports(static_cast<size_t>(sites));
  if (site == 0) {
    ports[0] = port;
    for (int s = 1; s < sites; ++s)
      if (::read(rfd[static_cast<size_t>(s)], &ports[static_cast<size_t>(s)], sizeof(int)) != sizeof(int))
        throw std::runtime_error("pipe read");
    for (int s = 1; s < sites; ++s)
      if (::write(wfd[static_cast<size_t>(s)], ports.data(), sizeof(int) * ports.size()) !=
          static_cast<ssize_t>(sizeof(int) * ports.size()))
        throw std::runtime_error("pipe write");
  } else {
    if (::write(wfd[0], &port, sizeof(int)) != sizeof(int)) throw std::runtime_error("pipe write");
    if (::read(rfd[0], ports.data(), sizeof(int) * ports.size()) != static_cast<ssize_t>(sizeof(int) * ports.size()))
      throw std::runtime_error("pipe read");
  }
  std::vector<transport::PeerInfo> peers;
  for (int s = 0; s < sites; ++s)
    if (s != site) peers.push_back({kNames[s], 0, "127.0.0.1", ports[static_cast<size_t>(s)]});
  t.connect(peers);
  outer::OuterOptions oo;
  for (int s = 0; s < sites; ++s) oo.sites.push_back({kNames[s], 1});
  oo.site = site;
  oo.params.total = 1000;  // (each site one rank: the layout only pairs rank 0 with rank 0)
  outer::SitePeers sp(oo, &t);
  RepResult res;

  std::shared_ptr<outer::JoinSnapshot> snap;
  std::vector<uint8_t> state;
  state = make_state(params);  // the joiner too: the raw copy's size, and to compare what it fetched
  res.state_bytes = state.size();
  if (site != 0) {
    snap = std::make_shared<outer::JoinSnapshot>();
    snap->state = state;
    const uint64_t wh = hash64(state.data(), state.size());
    snap->manifest = outer::describe_state(snap->state, static_cast<uint32_t>(o.chunk_bytes), 1, 1,
                                           (outer::SiteMask{1} << sites) - 1, wh);
  }
  const auto payload = transport::make_payload(std::move(state));
  const int joiner_peer = site == 0 ? -1 : sp.peer(0);

  auto raw = [&] {
    // Donor d1 sends the whole state as one message once the joiner's receive is posted.
    if (site == 0) {
      auto rh = t.recv(sp.peer(1), transport::FrameKind::kGlobalState, 99, 0, payload->size());
      const auto t0 = Clock::now();
      t.send(sp.peer(1), transport::FrameKind::kControl, 99, 1, transport::make_payload({1})).wait();
      rh.wait();
      res.raw_s = std::chrono::duration<double>(Clock::now() - t0).count();
      if (rh.bytes() != payload->size()) throw std::runtime_error("raw copy: short");
    } else if (site == 1) {
      t.recv(joiner_peer, transport::FrameKind::kControl, 99, 1, size_t{1}).wait();
      t.send(joiner_peer, transport::FrameKind::kGlobalState, 99, 0, payload).wait();
    }
  };
  auto join = [&] {
    if (site == 0) {
      const auto r = outer::fetch_join_state(sp, 60);
      res.join_s = r.seconds;
      res.bytes = r.bytes;
      if (r.state != *payload) throw std::runtime_error("join: the state differs");
    } else {
      // A donor takes the joiner in once it asks (as poll_join_requests does), then serves it.
      auto req = sp.post_recv(0, 0, outer::kJoinShard, 0);
      std::vector<uint8_t> b;
      sp.read(req, 0, outer::EnvelopeKind::kJoinRequest, 0, b, 0);
      outer::OuterHooks hooks;
      outer::JoinDonor d(sp, 0, snap, 30, hooks);
      while (!d.finished()) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  };
  if (raw_first) {
    raw();
    join();
  } else {
    join();
    raw();
  }
  // Everyone done before the transports close (the sends waited for too: through the
  // emulated link they leave the delay line after the others' have arrived here).
  std::vector<transport::SendHandle> done;
  for (int s = 0; s < sites; ++s)
    if (s != site)
      done.push_back(t.send(sp.peer(s), transport::FrameKind::kControl, 100, 0, transport::make_payload({1})));
  for (int s = 0; s < sites; ++s)
    if (s != site) t.recv(sp.peer(s), transport::FrameKind::kControl, 100, 0, size_t{1}).wait();
  for (auto& h : done) h.wait();
  return res;
}

RepResult one_rep(const Options& o, int64_t params, int donors, bool raw_first) {
  const int sites = donors + 1;
  std::vector<int> parent_w(static_cast<size_t>(sites), -1), parent_r(static_cast<size_t>(sites), -1);
  std::vector<pid_t> kids;
  for (int s = 1; s < sites; ++s) {
    int down[2], up[2];
    if (::pipe(down) != 0 || ::pipe(up) != 0) throw std::runtime_error("pipe");
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(down[1]);
      ::close(up[0]);
      std::vector<int> w(static_cast<size_t>(sites), -1), r(static_cast<size_t>(sites), -1);
      w[0] = up[1];
      r[0] = down[0];
      try {
        run_site(s, sites, o, params, raw_first, w, r);
        ::_exit(0);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_join: donor %d: %s\n", s, e.what());
        ::_exit(1);
      }
    }
    ::close(down[0]);
    ::close(up[1]);
    parent_w[static_cast<size_t>(s)] = down[1];
    parent_r[static_cast<size_t>(s)] = up[0];
    kids.push_back(pid);
  }
  RepResult r = run_site(0, sites, o, params, raw_first, parent_w, parent_r);
  for (pid_t k : kids) {
    int st = 0;
    ::waitpid(k, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) throw std::runtime_error("a donor process failed");
  }
  for (int s = 1; s < sites; ++s) {
    ::close(parent_w[static_cast<size_t>(s)]);
    ::close(parent_r[static_cast<size_t>(s)]);
  }
  return r;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

double load1() {
  std::ifstream f("/proc/loadavg");
  double l = 0;
  f >> l;
  return l;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"join (rejoin) time vs state size and donors, against a raw copy of the same bytes"};
  Options o;
  app.add_option("--params", o.params, "parameters of the state (default 1e6 1e7 1e8)");
  app.add_option("--donors", o.donors, "donor site counts (default 1 2 3)")->check(CLI::Range(1, 3));
  app.add_option("--reps", o.reps, "repetitions, median reported (default 5)")->check(CLI::Range(5, 100));
  app.add_option("--chunk-bytes", o.chunk_bytes, "outer.join_chunk_bytes (default 4 MiB)");
  app.add_option("--out", o.out, "also write the JSON here");
  app.add_option("--delay-ms", o.delay_ms, "emulated one-way delay between sites (transport.emulate), ms")
      ->check(CLI::Range(0.0, 10000.0));
  app.add_option("--rate-mbit", o.rate_mbit, "emulated rate cap per site pair (transport.emulate), Mbit/s")
      ->check(CLI::Range(0.0, 1e6));
  app.add_flag("--allow-load", o.allow_load,
               "run although the 1-minute load average is above 1 (figures marked loaded)");
  CLI11_PARSE(app, argc, argv);
  spdlog::set_level(spdlog::level::warn);
  try {
    nlohmann::json j;
    j["bench"] = "elastic_join_recovery";
    j["path"] = o.delay_ms > 0 || o.rate_mbit > 0
                    ? fmt::format(
                          "UCX over TCP loopback through transport.emulate ({} ms one way, {} Mbit/s per "
                          "site pair), one process per site",
                          o.delay_ms, o.rate_mbit)
                    : std::string("UCX over TCP loopback, one process per site");
    j["emulate"] = {{"delay_ms", o.delay_ms}, {"rate_mbit", o.rate_mbit}};
    j["peer"] = "the same bytes as one transport message from one donor (raw copy)";
    j["load_before"] = load1();
    j["loaded"] = j["load_before"].get<double>() > 1.0;
    if (j["loaded"].get<bool>() && !o.allow_load) {
      std::cerr << "bench_join: the 1-minute load average is " << j["load_before"]
                << " (above 1): figures would not be comparable; wait for a quiet machine or pass --allow-load\n";
      return 2;
    }
    j["chunk_bytes"] = o.chunk_bytes;
    j["reps"] = o.reps;
    nlohmann::json rows = nlohmann::json::array();
    for (int64_t p : o.params)
      for (int d : o.donors) {
        std::vector<double> js, rs;
        uint64_t state_bytes = 0, bytes = 0;
        for (int r = 0; r < o.reps; ++r) {
          const RepResult x = one_rep(o, p, d, r % 2 == 0);
          js.push_back(x.join_s);
          rs.push_back(x.raw_s);
          state_bytes = x.state_bytes;
          bytes = x.bytes;
        }
        const double jm = median(js), rm = median(rs);
        rows.push_back({{"params", p},
                        {"donors", d},
                        {"state_bytes", state_bytes},
                        {"join_bytes", bytes},
                        {"join_s", jm},
                        {"join_s_min", *std::min_element(js.begin(), js.end())},
                        {"join_s_max", *std::max_element(js.begin(), js.end())},
                        {"join_s_all", js},
                        {"raw_copy_s", rm},
                        {"raw_copy_s_min", *std::min_element(rs.begin(), rs.end())},
                        {"raw_copy_s_max", *std::max_element(rs.begin(), rs.end())},
                        {"raw_copy_s_all", rs},
                        {"join_gb_per_s", jm > 0 ? double(state_bytes) / jm / 1e9 : 0.0},
                        {"ratio_join_to_raw", rm > 0 ? jm / rm : 0.0}});
        std::cerr << "params " << p << " donors " << d << ": join " << jm << " s, raw " << rm << " s\n";
      }
    j["results"] = rows;
    j["load_after"] = load1();
    const std::string text = j.dump(2);
    std::cout << text << "\n";
    if (!o.out.empty()) std::ofstream(o.out) << text << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "bench_join: " << e.what() << "\n";
    return 1;
  }
}

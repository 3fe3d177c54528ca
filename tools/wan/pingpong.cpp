#include "tools/wan/pingpong.hpp"
#include "transport/probe/probe_result.hpp"

#include <arpa/inet.h>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <numeric>
#include <thread>

#include "core/error.hpp"
#include "core/fd.hpp"
#include "core/net.hpp"

namespace geoloco::wan {
namespace {

constexpr uint32_t kMagic = 0x50504c47;  // "GLPP" little endian
constexpr uint16_t kVersion = 1;
constexpr uint32_t kHeader = 24;
constexpr uint32_t kMaxSize = 1 << 20;

using Clock = std::chrono::steady_clock;

struct Endpoint {
  std::string host;
  int port = 0;
};

Endpoint parse_endpoint(const std::string& s) {
  const auto colon = s.rfind(':');
  if (colon == std::string::npos) throw InputError(fmt::format("endpoint '{}' must be ADDR:PORT", s));
  Endpoint e;
  e.host = s.substr(0, colon);
  in_addr a{};
  if (inet_pton(AF_INET, e.host.c_str(), &a) != 1)
    throw InputError(fmt::format("endpoint '{}': '{}' is not an IPv4 address", s, e.host));
  try {
    std::size_t used = 0;
    e.port = std::stoi(s.substr(colon + 1), &used);
    if (used != s.size() - colon - 1) e.port = -1;
  } catch (const std::exception&) {
    e.port = -1;
  }
  if (e.port < 1 || e.port > 65535) throw InputError(fmt::format("endpoint '{}': bad port", s));
  return e;
}

// Full-buffer I/O with a deadline. Returns false on orderly EOF before any byte (read only).
bool read_full(int fd, char* p, std::size_t n, Clock::time_point deadline, const std::string& peer) {
  const net::IoResult r = net::recv_all(fd, p, n, deadline);
  if (r.ok()) return true;
  switch (r.status) {
    case net::IoStatus::kClosed:
      if (r.bytes == 0) return false;
      throw Error(fmt::format("pingpong: {}: connection closed mid-message", peer));
    case net::IoStatus::kTimedOut: throw Error(fmt::format("pingpong: {}: timed out waiting for data", peer));
    default: throw Error(fmt::format("pingpong: {}: recv: {}", peer, r.message()));
  }
}

void write_full(int fd, const char* p, std::size_t n, Clock::time_point deadline, const std::string& peer) {
  const net::IoResult r = net::send_all(fd, p, n, deadline);
  if (r.ok()) return;
  if (r.status == net::IoStatus::kTimedOut) throw Error(fmt::format("pingpong: {}: timed out sending", peer));
  throw Error(fmt::format("pingpong: {}: send: {}", peer, r.message()));
}

void put_u16(char* p, uint16_t v) { std::memcpy(p, &v, 2); }
void put_u32(char* p, uint32_t v) { std::memcpy(p, &v, 4); }
void put_u64(char* p, uint64_t v) { std::memcpy(p, &v, 8); }
template <class T>
T get(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
static_assert(std::endian::native == std::endian::little, "wire format is little endian");

// Serves one client: echo every well-formed message until EOF.
void serve(int fd, const std::string& peer, double timeout_s) {
  net::set_nodelay(fd);
  std::vector<char> msg(kMaxSize);
  const auto idle = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  for (;;) {
    const auto deadline = Clock::now() + idle;
    if (!read_full(fd, msg.data(), kHeader, deadline, peer)) return;
    if (get<uint32_t>(msg.data()) != kMagic || get<uint16_t>(msg.data() + 4) != kVersion)
      throw Error(fmt::format("pingpong: {}: bad magic/version", peer));
    const uint64_t size = get<uint64_t>(msg.data() + 16);
    if (size < kHeader || size > kMaxSize) throw Error(fmt::format("pingpong: {}: bad message size {}", peer, size));
    read_full(fd, msg.data() + kHeader, size - kHeader, deadline, peer);
    write_full(fd, msg.data(), size, deadline, peer);
  }
}

}  // namespace

RttSummary summarize(std::vector<double> rtt_ms) {
  const probe::RttStats st = probe::RttStats::of(rtt_ms);
  RttSummary s;
  s.min_ms = st.min_ms;
  s.max_ms = st.max_ms;
  s.mean_ms = st.mean_ms;
  s.median_ms = st.median_ms;
  s.p99_ms = st.p99_ms;
  s.rtt_ms = std::move(rtt_ms);
  return s;
}

std::string RttSummary::to_json() const {
  nlohmann::json j;
  j["format"] = "geoloco-wan-pingpong";
  j["version"] = 1;
  j["count"] = rtt_ms.size();
  j["rtt_ms"] = {{"min", min_ms}, {"median", median_ms}, {"mean", mean_ms}, {"p99", p99_ms}, {"max", max_ms}};
  return j.dump();
}

void run_pingpong_server(const PingpongServerOptions& opt) {
  const Endpoint at = parse_endpoint(opt.listen);
  if (opt.connections < 0) throw InputError("--connections must be >= 0");
  Fd ls;
  try {
    ls = net::listen_tcp(at.host, at.port, 16);
  } catch (const Error& e) {
    throw Error(fmt::format("pingpong: {}", e.what()));
  }
  if (!opt.ready_file.empty()) std::ofstream(opt.ready_file) << getpid() << "\n";
  spdlog::info("pingpong: listening on {}", opt.listen);
  const auto idle = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(opt.timeout_s));
  for (int served = 0; opt.connections == 0 || served < opt.connections; ++served) {
    net::Accepted c = net::accept_until(ls.get(), Clock::now() + idle);
    if (!c.fd) {
      if (c.timed_out) throw Error(fmt::format("pingpong: no client on {} within {} s", opt.listen, opt.timeout_s));
      throw Error(fmt::format("pingpong: accept: {}", c.error));
    }
    serve(c.fd.get(), c.peer, opt.timeout_s);
  }
}

RttSummary run_pingpong_client(const PingpongClientOptions& opt) {
  const Endpoint at = parse_endpoint(opt.connect);
  if (opt.count < 1) throw InputError("--count must be >= 1");
  if (opt.warmup < 0) throw InputError("--warmup must be >= 0");
  if (opt.size < kHeader || opt.size > kMaxSize)
    throw InputError(fmt::format("--size must be in {}..{}", kHeader, kMaxSize));

  // Connect, retrying while the server is not listening yet (it starts in another namespace).
  const auto connect_deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(opt.connect_timeout_s));
  net::ConnectResult c =
      net::connect_until(at.host, at.port, connect_deadline, std::chrono::seconds(1), std::chrono::milliseconds(100));
  if (!c.fd)
    throw Error(
        fmt::format("pingpong: connect {}: {} (gave up after {} s)", opt.connect, c.error, opt.connect_timeout_s));
  const Fd s = std::move(c.fd);  // TCP_NODELAY set by the connect

  std::vector<char> out(opt.size, 0), in(opt.size);
  std::vector<double> rtts;
  rtts.reserve(static_cast<std::size_t>(opt.count));
  const auto per_echo = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(opt.timeout_s));
  for (int k = 0; k < opt.warmup + opt.count; ++k) {
    put_u32(out.data(), kMagic);
    put_u16(out.data() + 4, kVersion);
    put_u16(out.data() + 6, 0);
    put_u64(out.data() + 8, static_cast<uint64_t>(k));
    put_u64(out.data() + 16, opt.size);
    const auto t0 = Clock::now();
    const auto deadline = t0 + per_echo;
    write_full(s.get(), out.data(), out.size(), deadline, opt.connect);
    if (!read_full(s.get(), in.data(), in.size(), deadline, opt.connect))
      throw Error(fmt::format("pingpong: {}: server closed the connection", opt.connect));
    const auto t1 = Clock::now();
    if (get<uint32_t>(in.data()) != kMagic || get<uint64_t>(in.data() + 8) != static_cast<uint64_t>(k) ||
        get<uint64_t>(in.data() + 16) != opt.size)
      throw Error(fmt::format("pingpong: {}: echo {} does not match what was sent", opt.connect, k));
    if (k >= opt.warmup) rtts.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    if (opt.interval_ms > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(opt.interval_ms));
  }
  return summarize(std::move(rtts));
}

}  // namespace geoloco::wan

#include "tools/wan/pingpong.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <numeric>
#include <thread>

#include "trainer/core/error.hpp"

namespace geoloco::wan {
namespace {

constexpr uint32_t kMagic = 0x50504c47;  // "GLPP" little endian
constexpr uint16_t kVersion = 1;
constexpr uint32_t kHeader = 24;
constexpr uint32_t kMaxSize = 1 << 20;

using Clock = std::chrono::steady_clock;

class Socket {
 public:
  explicit Socket(int fd = -1) : fd_(fd) {}
  ~Socket() {
    if (fd_ >= 0) close(fd_);
  }
  Socket(Socket&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Socket& operator=(Socket&& o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

sockaddr_in parse_endpoint(const std::string& s) {
  const auto colon = s.rfind(':');
  if (colon == std::string::npos) throw InputError(fmt::format("endpoint '{}' must be ADDR:PORT", s));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  if (inet_pton(AF_INET, s.substr(0, colon).c_str(), &a.sin_addr) != 1)
    throw InputError(fmt::format("endpoint '{}': '{}' is not an IPv4 address", s, s.substr(0, colon)));
  int port = 0;
  try {
    std::size_t used = 0;
    port = std::stoi(s.substr(colon + 1), &used);
    if (used != s.size() - colon - 1) port = -1;
  } catch (const std::exception&) {
    port = -1;
  }
  if (port < 1 || port > 65535) throw InputError(fmt::format("endpoint '{}': bad port", s));
  a.sin_port = htons(static_cast<uint16_t>(port));
  return a;
}

// Waits for fd to become ready for `events` until `deadline`; false on timeout.
bool wait_fd(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd, events, 0};
    const int r = poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) throw Error(fmt::format("pingpong: poll: {}", std::strerror(errno)));
  }
}

// Full-buffer I/O with a deadline. Returns false on orderly EOF before any byte (read only).
bool read_full(int fd, char* p, std::size_t n, Clock::time_point deadline, const std::string& peer) {
  std::size_t got = 0;
  while (got < n) {
    if (!wait_fd(fd, POLLIN, deadline)) throw Error(fmt::format("pingpong: {}: timed out waiting for data", peer));
    const ssize_t r = recv(fd, p + got, n - got, 0);
    if (r == 0) {
      if (got == 0) return false;
      throw Error(fmt::format("pingpong: {}: connection closed mid-message", peer));
    }
    if (r < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      throw Error(fmt::format("pingpong: {}: recv: {}", peer, std::strerror(errno)));
    }
    got += static_cast<std::size_t>(r);
  }
  return true;
}

void write_full(int fd, const char* p, std::size_t n, Clock::time_point deadline, const std::string& peer) {
  std::size_t sent = 0;
  while (sent < n) {
    if (!wait_fd(fd, POLLOUT, deadline)) throw Error(fmt::format("pingpong: {}: timed out sending", peer));
    const ssize_t r = send(fd, p + sent, n - sent, MSG_NOSIGNAL);
    if (r < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      throw Error(fmt::format("pingpong: {}: send: {}", peer, std::strerror(errno)));
    }
    sent += static_cast<std::size_t>(r);
  }
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

void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

// Serves one client: echo every well-formed message until EOF.
void serve(int fd, const std::string& peer, double timeout_s) {
  set_nodelay(fd);
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

double percentile(std::vector<double> v, double q) {
  GEOLOCO_CHECK(!v.empty() && q >= 0.0 && q <= 1.0, "percentile of {} values at {}", v.size(), q);
  std::sort(v.begin(), v.end());
  // Nearest rank: the smallest value with at least q of the sample at or below it.
  std::size_t rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(v.size())));
  rank = std::clamp<std::size_t>(rank, 1, v.size());
  return v[rank - 1];
}

RttSummary summarize(std::vector<double> rtt_ms) {
  GEOLOCO_CHECK(!rtt_ms.empty(), "no RTT samples");
  RttSummary s;
  s.min_ms = *std::min_element(rtt_ms.begin(), rtt_ms.end());
  s.max_ms = *std::max_element(rtt_ms.begin(), rtt_ms.end());
  s.mean_ms = std::accumulate(rtt_ms.begin(), rtt_ms.end(), 0.0) / static_cast<double>(rtt_ms.size());
  s.median_ms = percentile(rtt_ms, 0.5);
  s.p99_ms = percentile(rtt_ms, 0.99);
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
  const sockaddr_in addr = parse_endpoint(opt.listen);
  if (opt.connections < 0) throw InputError("--connections must be >= 0");
  Socket ls(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (ls.get() < 0) throw Error(fmt::format("pingpong: socket: {}", std::strerror(errno)));
  int one = 1;
  setsockopt(ls.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(ls.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0)
    throw Error(fmt::format("pingpong: bind {}: {}", opt.listen, std::strerror(errno)));
  if (listen(ls.get(), 16) != 0) throw Error(fmt::format("pingpong: listen {}: {}", opt.listen, std::strerror(errno)));
  if (!opt.ready_file.empty()) std::ofstream(opt.ready_file) << getpid() << "\n";
  spdlog::info("pingpong: listening on {}", opt.listen);
  const auto idle = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(opt.timeout_s));
  for (int served = 0; opt.connections == 0 || served < opt.connections; ++served) {
    if (!wait_fd(ls.get(), POLLIN, Clock::now() + idle))
      throw Error(fmt::format("pingpong: no client on {} within {} s", opt.listen, opt.timeout_s));
    sockaddr_in peer{};
    socklen_t len = sizeof peer;
    Socket c(accept4(ls.get(), reinterpret_cast<sockaddr*>(&peer), &len, SOCK_CLOEXEC));
    if (c.get() < 0) throw Error(fmt::format("pingpong: accept: {}", std::strerror(errno)));
    char ip[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, &peer.sin_addr, ip, sizeof ip);
    serve(c.get(), fmt::format("{}:{}", ip, ntohs(peer.sin_port)), opt.timeout_s);
  }
}

RttSummary run_pingpong_client(const PingpongClientOptions& opt) {
  const sockaddr_in addr = parse_endpoint(opt.connect);
  if (opt.count < 1) throw InputError("--count must be >= 1");
  if (opt.warmup < 0) throw InputError("--warmup must be >= 0");
  if (opt.size < kHeader || opt.size > kMaxSize)
    throw InputError(fmt::format("--size must be in {}..{}", kHeader, kMaxSize));

  // Connect, retrying while the server is not listening yet (it starts in another namespace).
  Socket s;
  const auto connect_deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(opt.connect_timeout_s));
  for (;;) {
    s = Socket(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (s.get() < 0) throw Error(fmt::format("pingpong: socket: {}", std::strerror(errno)));
    if (connect(s.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0) break;
    const int e = errno;
    if (Clock::now() >= connect_deadline)
      throw Error(fmt::format("pingpong: connect {}: {} (gave up after {} s)", opt.connect, std::strerror(e),
                              opt.connect_timeout_s));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  set_nodelay(s.get());

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
    if (opt.interval_ms > 0)
      std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(opt.interval_ms));
  }
  return summarize(std::move(rtts));
}

}  // namespace geoloco::wan

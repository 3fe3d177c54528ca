// The TCP gate in front of the UCX listener, listener and dialer sides (gate.hpp).
#include "transport/ucx/gate.hpp"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/log.hpp"
#include "core/net.hpp"
#include "transport/site_directory.hpp"
#include "transport/transport_error.hpp"

namespace geoloco::transport::ucx {

namespace {

using Clock = std::chrono::steady_clock;

// "" on success, otherwise what went wrong.
std::string read_exact(int fd, uint8_t* buf, size_t n, Clock::time_point deadline) {
  return net::recv_all(fd, buf, n, deadline).message();
}

std::string write_all(int fd, const uint8_t* buf, size_t n, Clock::time_point deadline) {
  return net::send_all(fd, buf, n, deadline).message();
}

std::string send_msg(int fd, const std::vector<uint8_t>& body, Clock::time_point deadline) {
  uint8_t len[2] = {static_cast<uint8_t>(body.size()), static_cast<uint8_t>(body.size() >> 8)};
  if (auto e = write_all(fd, len, 2, deadline); !e.empty()) return e;
  return write_all(fd, body.data(), body.size(), deadline);
}

// Reads one length-prefixed message; the length is checked before anything is allocated.
std::string recv_msg(int fd, std::vector<uint8_t>& out, Clock::time_point deadline) {
  uint8_t len[2];
  if (auto e = read_exact(fd, len, 2, deadline); !e.empty()) return e;
  size_t n = len[0] | (static_cast<size_t>(len[1]) << 8);
  if (n > kMaxHandshakeBytes) return fmt::format("message length {} exceeds {}", n, kMaxHandshakeBytes);
  out.resize(n);
  return read_exact(fd, out.data(), n, deadline);
}

}  // namespace

// ---- listener side ------------------------------------------------------------------------

Gate::Gate(const std::string& host, int port, HsLocal local, double handshake_timeout_s, int ucx_port)
    : local_(std::move(local)), handshake_timeout_s_(handshake_timeout_s), ucx_port_(ucx_port) {
  struct in_addr ip {};
  if (inet_pton(AF_INET, host.c_str(), &ip) != 1)
    throw TransportError(fmt::format("listen address '{}' is not an IPv4 address", host));
  // SO_REUSEADDR: a restarted run must be able to rebind its port at once (ENVIRONMENT.md).
  try {
    listen_fd_ = net::listen_tcp(host, port, 64);
  } catch (const Error& e) {
    throw TransportError(e.what());
  }
  port_ = net::local_port(listen_fd_.get());
  stop_fd_ = Fd(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!stop_fd_) throw TransportError(fmt::format("eventfd: {}", std::strerror(errno)));
  acceptor_ = std::thread([this] { accept_loop(); });
}

Gate::~Gate() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(stop_fd_.get(), &one, sizeof(one));
  acceptor_.join();
  for (auto& c : clients_) c.thread.join();  // each has a deadline
}

void Gate::set_peers(const std::vector<PeerInfo>& peers) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    peers_ = peers;
  }
  cv_.notify_all();
}

void Gate::set_directory(std::vector<std::string> addresses) {
  auto bytes = encode_site_directory(addresses);
  {
    std::lock_guard<std::mutex> lock(mu_);
    directory_ = std::move(bytes);
  }
  cv_.notify_all();
}

std::string Gate::refusal_for(const std::string& site, int rank) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = refusals_.find(fmt::format("{}/{}", site, rank));
  return it == refusals_.end() ? std::string() : it->second;
}

void Gate::accept_loop() {
  while (true) {
    struct pollfd fds[2] = {{listen_fd_.get(), POLLIN, 0}, {stop_fd_.get(), POLLIN, 0}};
    if (net::poll_until(fds, net::kNoDeadline) < 0) continue;
    if (fds[1].revents & POLLIN) return;
    if (!(fds[0].revents & POLLIN)) continue;
    net::Accepted acc = net::accept_until(listen_fd_.get(), Clock::now());
    if (!acc.fd) continue;
    const std::string remote = acc.peer;
    if (active_.load() >= kMaxGateClients) {
      spdlog::warn("transport: gate refused {}: too many connections in progress", remote);
      ++refused_;
      continue;  // closes it
    }
    ++active_;
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = clients_.begin(); it != clients_.end();) {
      if (it->done->load()) {
        it->thread.join();
        it = clients_.erase(it);
      } else {
        ++it;
      }
    }
    auto done = std::make_shared<std::atomic<bool>>(false);
    clients_.push_back(Client{std::thread([this, fd = std::make_shared<Fd>(std::move(acc.fd)), remote, done] {
                                serve(std::move(*fd), remote);
                                --active_;
                                done->store(true);
                              }),
                              done});
  }
}

void Gate::refuse(int fd, const std::string& remote, const std::string& claimed, const std::string& reason) {
  spdlog::warn("transport: gate refused {}{}: {}", claimed.empty() ? "" : claimed + " from ", remote, reason);
  ++refused_;
  if (!claimed.empty()) {
    std::lock_guard<std::mutex> lock(mu_);
    refusals_[claimed] = fmt::format("refused {} from {}: {}", claimed, remote, reason);
  }
  const auto rej = HandshakeSession::reject(local_.version, reason);
  send_msg(fd, rej, Clock::now() + std::chrono::milliseconds(200));
}

void Gate::serve(Fd fd, std::string remote) {
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(handshake_timeout_s_));
  std::vector<uint8_t> buf;
  if (auto e = recv_msg(fd.get(), buf, deadline); !e.empty()) return refuse(fd.get(), remote, "", e);
  // Only a known peer's refusals are kept for the connect-timeout message (an impostor must
  // not be able to fill that table).
  std::string claimed;
  bool directory = false, unready = false;
  auto admit = [&](const HsMessage& hello) -> std::string {
    if (hello.lane == kDirectoryLane) {
      // Any rank of another site may ask (the handshake proves it holds the run's key), before
      // our connect(): the other sites look their peers up before they dial.
      if (hello.site == local_.self.site) return "a directory request from this site's own rank";
      directory = true;
      return {};
    }
    std::vector<PeerInfo> peers;
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Peers dialing before our connect() wait here for the peer list.
      if (!cv_.wait_until(lock, deadline, [&] { return peers_.has_value() || stopping_; }) || stopping_) {
        unready = true;  // closed without a refusal: the dialer tries again
        return "not connecting yet";
      }
      peers = *peers_;
    }
    const PeerInfo* peer = nullptr;
    for (auto& p : peers)
      if (p.site == hello.site && p.rank == hello.rank) peer = &p;
    if (peer == nullptr) return fmt::format("{}/{} is not one of our peers", hello.site, hello.rank);
    claimed = fmt::format("{}/{}", hello.site, hello.rank);
    if (dials(local_.self, *peer) && !joiners_.load()) return "we dial this peer, it must not dial us";
    if (hello.lane != kGateLane) return "not a gate hello";
    return {};
  };
  auto hs = HandshakeSession::listener(local_, admit, static_cast<uint32_t>(ucx_port_));
  while (true) {
    auto step = hs.on_message(buf);
    using O = HandshakeSession::Outcome;
    if (step.outcome == O::kRejected) {
      spdlog::warn("transport: {} from {} refused us: {}", claimed, remote, step.error);
      ++refused_;
      std::lock_guard<std::mutex> lock(mu_);
      if (!claimed.empty()) refusals_[claimed] = fmt::format("{} from {} refused us: {}", claimed, remote, step.error);
      return;
    }
    if (step.outcome == O::kRefused) return unready ? void() : refuse(fd.get(), remote, claimed, step.error);
    if (step.reply)
      if (auto e = send_msg(fd.get(), *step.reply, deadline); !e.empty()) return;
    if (step.outcome == O::kAuthenticated) break;
    if (auto e = recv_msg(fd.get(), buf, deadline); !e.empty()) return refuse(fd.get(), remote, claimed, e);
  }
  if (directory) {
    std::vector<uint8_t> dir;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (!cv_.wait_until(lock, deadline, [&] { return directory_.has_value() || stopping_; }) || stopping_) return;
      dir = *directory_;
    }
    if (auto e = write_all(fd.get(), dir.data(), dir.size(), deadline); !e.empty())
      spdlog::warn("transport: sending the site directory to {}: {}", remote, e);
  }
  // Wait for the dialer to close first so our side does not sit in TIME_WAIT.
  uint8_t b;
  read_exact(fd.get(), &b, 1, std::min(deadline, Clock::now() + std::chrono::seconds(1)));
}

// ---- dialer side --------------------------------------------------------------------------

namespace {

// One attempt. Returns the UCX port, or nullopt with `err` set (retryable); throws
// HandshakeError when retrying cannot help.
std::optional<int> gate_attempt(const PeerInfo& peer, const HsLocal& local, double handshake_timeout_s,
                                Clock::time_point deadline, std::string& err, uint16_t lane = kGateLane,
                                int directory_ranks = 0, std::vector<std::string>* directory = nullptr) {
  struct in_addr ip {};
  if (inet_pton(AF_INET, peer.host.c_str(), &ip) != 1)
    throw HandshakeError(fmt::format("peer {}: host is not an IPv4 address", peer.name()));
  net::ConnectResult c = net::try_connect(peer.host, peer.port, deadline);
  if (!c.fd) {
    err = fmt::format("connect: {}", c.error);
    return std::nullopt;
  }
  Fd fd = std::move(c.fd);
  const auto hs_deadline = std::min(deadline, Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                                 std::chrono::duration<double>(handshake_timeout_s)));
  auto hs = HandshakeSession::dialer(local, peer.site, peer.rank, lane, /*expect_port=*/true);
  std::vector<uint8_t> out = hs.hello(), in;
  const char* waiting = "hello-ack";
  while (true) {
    if (auto e = send_msg(fd.get(), out, hs_deadline); !e.empty()) {
      err = fmt::format("sending the handshake: {}", e);
      return std::nullopt;
    }
    if (auto e = recv_msg(fd.get(), in, hs_deadline); !e.empty()) {
      err = fmt::format("waiting for {}: {}", waiting, e);
      return std::nullopt;
    }
    auto step = hs.on_message(in);
    using O = HandshakeSession::Outcome;
    if (step.outcome == O::kRejected) throw HandshakeError(fmt::format("refused by {}: {}", peer.name(), step.error));
    if (step.outcome == O::kRefused) {
      spdlog::warn("transport: refusing {}: {}", peer.name(), step.error);
      send_msg(fd.get(), *step.reply, Clock::now() + std::chrono::milliseconds(200));
      throw HandshakeError(fmt::format("handshake with {} failed: {}", peer.name(), step.error));
    }
    if (step.outcome == O::kAuthenticated) {
      if (directory) {
        // The site directory follows: its header, then exactly the body it announces.
        std::vector<uint8_t> bytes(kDirectoryHeaderBytes);
        if (auto e = read_exact(fd.get(), bytes.data(), bytes.size(), hs_deadline); !e.empty()) {
          err = fmt::format("waiting for the site directory: {}", e);
          return std::nullopt;
        }
        const size_t body = site_directory_body_bytes(bytes, static_cast<uint32_t>(directory_ranks), peer.name());
        bytes.resize(kDirectoryHeaderBytes + body);
        if (auto e = read_exact(fd.get(), bytes.data() + kDirectoryHeaderBytes, body, hs_deadline); !e.empty()) {
          err = fmt::format("reading the site directory: {}", e);
          return std::nullopt;
        }
        *directory = decode_site_directory(bytes, static_cast<uint32_t>(directory_ranks), peer.name());
      }
      return static_cast<int>(hs.port());
    }
    out = std::move(*step.reply);
    waiting = "auth-ok";
  }
}

}  // namespace

int gate_dial(const PeerInfo& peer, const HsLocal& local, double handshake_timeout_s, Clock::time_point deadline,
              double unreachable_s) {
  std::string last = "no attempt";
  const auto t0 = Clock::now();
  bool reached = false;
  while (Clock::now() < deadline) {
    std::string err;
    if (auto port = gate_attempt(peer, local, handshake_timeout_s, deadline, err)) return *port;
    last = err;
    reached = reached || err.rfind("connect: ", 0) != 0;
    if (!reached && unreachable_s > 0 && std::chrono::duration<double>(Clock::now() - t0).count() >= unreachable_s)
      throw TimeoutError(fmt::format("{} not reachable for {} s ({})", peer.name(), unreachable_s, last));
    auto retry = Clock::now() + std::chrono::milliseconds(200);
    std::this_thread::sleep_until(std::min(retry, deadline));
  }
  throw TimeoutError(fmt::format("{} ({})", peer.name(), last));
}

std::vector<std::string> gate_directory(const PeerInfo& rank0, int ranks, const HsLocal& local,
                                        double handshake_timeout_s, Clock::time_point deadline) {
  std::string last = "no attempt";
  while (Clock::now() < deadline) {
    std::string err;
    std::vector<std::string> dir;
    if (gate_attempt(rank0, local, handshake_timeout_s, deadline, err, kDirectoryLane, ranks, &dir)) return dir;
    last = err;
    std::this_thread::sleep_until(std::min(Clock::now() + std::chrono::milliseconds(200), deadline));
  }
  throw TimeoutError(fmt::format("the site directory of {} at {}:{} ({})", rank0.site, rank0.host, rank0.port, last));
}

}  // namespace geoloco::transport::ucx

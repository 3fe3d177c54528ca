#include "transport/gate.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "trainer/core/hash.hpp"
#include "trainer/core/log.hpp"
#include "transport/transport_error.hpp"

namespace geoloco::transport {

namespace {

using Clock = std::chrono::steady_clock;

// Owns one file descriptor.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

int ms_left(Clock::time_point deadline) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return ms <= 0 ? 0 : static_cast<int>(std::min<int64_t>(ms, 1 << 30));
}

// "" on success, otherwise what went wrong.
std::string read_exact(int fd, uint8_t* buf, size_t n, Clock::time_point deadline) {
  size_t got = 0;
  while (got < n) {
    struct pollfd p{fd, POLLIN, 0};
    int r = ::poll(&p, 1, ms_left(deadline));
    if (r == 0) return "timed out";
    if (r < 0) {
      if (errno == EINTR) continue;
      return fmt::format("poll: {}", std::strerror(errno));
    }
    ssize_t k = ::recv(fd, buf + got, n - got, 0);
    if (k == 0) return "connection closed";
    if (k < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return fmt::format("recv: {}", std::strerror(errno));
    }
    got += static_cast<size_t>(k);
  }
  return {};
}

std::string write_all(int fd, const uint8_t* buf, size_t n, Clock::time_point deadline) {
  size_t put = 0;
  while (put < n) {
    struct pollfd p{fd, POLLOUT, 0};
    int r = ::poll(&p, 1, ms_left(deadline));
    if (r == 0) return "timed out";
    if (r < 0) {
      if (errno == EINTR) continue;
      return fmt::format("poll: {}", std::strerror(errno));
    }
    ssize_t k = ::send(fd, buf + put, n - put, MSG_NOSIGNAL);
    if (k < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return fmt::format("send: {}", std::strerror(errno));
    }
    put += static_cast<size_t>(k);
  }
  return {};
}

std::string send_msg(int fd, const HsMessage& m, Clock::time_point deadline) {
  auto body = m.encode();
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

HsMessage hello_of(HsType type, const Identity& self, const TransportConfig& cfg, uint16_t version, const Nonce& n) {
  HsMessage m;
  m.version = version;
  m.type = type;
  m.run_id = self.run_id;
  m.config_hash = self.config_hash;
  m.chunk_bytes = cfg.chunk_bytes;
  m.lanes = static_cast<uint16_t>(cfg.lanes);
  m.lane = kGateLane;
  m.site = self.site;
  m.rank = self.rank;
  m.nonce = n;
  return m;
}

HsMessage reject_of(uint16_t version, const std::string& reason) {
  HsMessage m;
  m.version = version;
  m.type = HsType::kReject;
  m.reason = reason;
  return m;
}

HsTranscript gate_transcript(const Identity& self, bool self_dials, const std::string& peer_site, int peer_rank,
                             const Nonce& mine, const Nonce& theirs) {
  HsTranscript t;
  t.run_id = self.run_id;
  t.config_hash = self.config_hash;
  t.lane = kGateLane;
  if (self_dials) {
    t.dialer_site = self.site, t.dialer_rank = self.rank, t.dialer_nonce = mine;
    t.listener_site = peer_site, t.listener_rank = peer_rank, t.listener_nonce = theirs;
  } else {
    t.dialer_site = peer_site, t.dialer_rank = peer_rank, t.dialer_nonce = theirs;
    t.listener_site = self.site, t.listener_rank = self.rank, t.listener_nonce = mine;
  }
  return t;
}

}  // namespace

std::string hello_mismatch(const HsMessage& m, const Identity& self, const TransportConfig& cfg) {
  if (m.run_id != self.run_id) return fmt::format("run id mismatch: peer '{}', ours '{}'", m.run_id, self.run_id);
  if (m.config_hash != self.config_hash)
    return fmt::format("config hash mismatch: peer {}, ours {}", hex64(m.config_hash), hex64(self.config_hash));
  if (m.chunk_bytes != cfg.chunk_bytes)
    return fmt::format("chunk_bytes mismatch: peer {}, ours {}", m.chunk_bytes, cfg.chunk_bytes);
  if (m.lanes != cfg.lanes) return fmt::format("lanes mismatch: peer {}, ours {}", m.lanes, cfg.lanes);
  if (m.lane != kGateLane && m.lane >= m.lanes) return fmt::format("lane {} out of range (lanes {})", m.lane, m.lanes);
  return {};
}

// ---- listener side ------------------------------------------------------------------------

Gate::Gate(const std::string& host, int port, const Identity& self, const TransportConfig& cfg, uint16_t version,
           int ucx_port)
    : self_(self), cfg_(cfg), version_(version), ucx_port_(ucx_port) {
  struct sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host.c_str(), &sa.sin_addr) != 1)
    throw TransportError(fmt::format("listen address '{}' is not an IPv4 address", host));
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) throw TransportError(fmt::format("socket: {}", std::strerror(errno)));
  int one = 1;
  // A restarted run must be able to rebind its port at once (ENVIRONMENT.md).
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(listen_fd_, reinterpret_cast<struct sockaddr*>(&sa), sizeof(sa)) != 0 || ::listen(listen_fd_, 64) != 0) {
    int err = errno;
    ::close(listen_fd_);
    throw TransportError(fmt::format("listen on {}:{}: {}", host, port, std::strerror(err)));
  }
  socklen_t len = sizeof(sa);
  ::getsockname(listen_fd_, reinterpret_cast<struct sockaddr*>(&sa), &len);
  port_ = ntohs(sa.sin_port);
  stop_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (stop_fd_ < 0) {
    ::close(listen_fd_);
    throw TransportError(fmt::format("eventfd: {}", std::strerror(errno)));
  }
  acceptor_ = std::thread([this] { accept_loop(); });
}

Gate::~Gate() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(stop_fd_, &one, sizeof(one));
  acceptor_.join();
  for (auto& c : clients_) c.thread.join();  // each has a deadline
  ::close(listen_fd_);
  ::close(stop_fd_);
}

void Gate::set_peers(const std::vector<PeerInfo>& peers) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    peers_ = peers;
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
    struct pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    int r = ::poll(fds, 2, -1);
    if (r < 0 && errno == EINTR) continue;
    if (fds[1].revents & POLLIN) return;
    if (!(fds[0].revents & POLLIN)) continue;
    struct sockaddr_in sa{};
    socklen_t len = sizeof(sa);
    int fd = ::accept4(listen_fd_, reinterpret_cast<struct sockaddr*>(&sa), &len, SOCK_CLOEXEC);
    if (fd < 0) continue;
    char host[INET_ADDRSTRLEN] = "?";
    inet_ntop(AF_INET, &sa.sin_addr, host, sizeof(host));
    std::string remote = fmt::format("{}:{}", host, ntohs(sa.sin_port));
    if (active_.load() >= kMaxGateClients) {
      spdlog::warn("transport: gate refused {}: too many connections in progress", remote);
      ++refused_;
      ::close(fd);
      continue;
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
    clients_.push_back(Client{std::thread([this, fd, remote, done] {
                                serve(fd, remote);
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
  send_msg(fd, reject_of(version_, reason), Clock::now() + std::chrono::milliseconds(200));
}

void Gate::serve(int raw_fd, std::string remote) {
  Fd fd(raw_fd);
  auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(cfg_.handshake_timeout_s));
  std::vector<uint8_t> buf;
  if (auto e = recv_msg(fd.get(), buf, deadline); !e.empty()) return refuse(fd.get(), remote, "", e);
  HsDecoded d = decode_handshake(buf, version_);
  if (!d.msg) return refuse(fd.get(), remote, "", d.error);
  HsMessage hello = std::move(*d.msg);
  if (hello.type != HsType::kHello) return refuse(fd.get(), remote, "", "expected hello");
  std::string claimed = fmt::format("{}/{}", hello.site, hello.rank);
  std::vector<PeerInfo> peers;
  {
    std::unique_lock<std::mutex> lock(mu_);
    // Peers dialing before our connect() wait here for the peer list.
    if (!cv_.wait_until(lock, deadline, [&] { return peers_.has_value() || stopping_; }) || stopping_)
      return;
    peers = *peers_;
  }
  const PeerInfo* peer = nullptr;
  for (auto& p : peers)
    if (p.site == hello.site && p.rank == hello.rank) peer = &p;
  if (peer == nullptr) return refuse(fd.get(), remote, "", fmt::format("{} is not one of our peers", claimed));
  if (dials(self_, *peer)) return refuse(fd.get(), remote, claimed, "we dial this peer, it must not dial us");
  if (auto e = hello_mismatch(hello, self_, cfg_); !e.empty()) return refuse(fd.get(), remote, claimed, e);
  if (hello.lane != kGateLane) return refuse(fd.get(), remote, claimed, "not a gate hello");
  Nonce mine = random_nonce();
  HsTranscript t = gate_transcript(self_, false, hello.site, hello.rank, mine, hello.nonce);
  HsMessage ack = hello_of(HsType::kHelloAck, self_, cfg_, version_, mine);
  ack.mac = compute_mac(cfg_.psk, t, "listener");
  if (auto e = send_msg(fd.get(), ack, deadline); !e.empty()) return;
  if (auto e = recv_msg(fd.get(), buf, deadline); !e.empty()) return refuse(fd.get(), remote, claimed, e);
  d = decode_handshake(buf, version_);
  if (!d.msg) return refuse(fd.get(), remote, claimed, d.error);
  if (d.msg->type == HsType::kReject) {
    spdlog::warn("transport: {} from {} refused us: {}", claimed, remote, d.msg->reason);
    ++refused_;
    std::lock_guard<std::mutex> lock(mu_);
    refusals_[claimed] = fmt::format("{} from {} refused us: {}", claimed, remote, d.msg->reason);
    return;
  }
  if (d.msg->type != HsType::kAuth) return refuse(fd.get(), remote, claimed, "expected auth");
  if (!mac_equal(d.msg->mac, compute_mac(cfg_.psk, t, "dialer")))
    return refuse(fd.get(), remote, claimed,
                  "authentication failed: the dialer's HMAC does not verify (different pre-shared key?)");
  HsMessage ok;
  ok.version = version_;
  ok.type = HsType::kAuthOk;
  ok.port = static_cast<uint32_t>(ucx_port_);
  send_msg(fd.get(), ok, deadline);
  // Wait for the dialer to close first so our side does not sit in TIME_WAIT.
  uint8_t b;
  read_exact(fd.get(), &b, 1, std::min(deadline, Clock::now() + std::chrono::seconds(1)));
}

// ---- dialer side --------------------------------------------------------------------------

namespace {

// One attempt. Returns the UCX port, or nullopt with `err` set (retryable); throws
// HandshakeError when retrying cannot help.
std::optional<int> gate_attempt(const PeerInfo& peer, const Identity& self, const TransportConfig& cfg,
                                uint16_t version, Clock::time_point deadline, std::string& err) {
  struct sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(peer.port));
  if (inet_pton(AF_INET, peer.host.c_str(), &sa.sin_addr) != 1)
    throw HandshakeError(fmt::format("peer {}: host is not an IPv4 address", peer.name()));
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (fd.get() < 0) throw TransportError(fmt::format("socket: {}", std::strerror(errno)));
  if (::connect(fd.get(), reinterpret_cast<struct sockaddr*>(&sa), sizeof(sa)) != 0) {
    if (errno != EINPROGRESS) {
      err = fmt::format("connect: {}", std::strerror(errno));
      return std::nullopt;
    }
    struct pollfd p{fd.get(), POLLOUT, 0};
    if (::poll(&p, 1, ms_left(deadline)) <= 0) {
      err = "connect timed out";
      return std::nullopt;
    }
    int so = 0;
    socklen_t sl = sizeof(so);
    ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &so, &sl);
    if (so != 0) {
      err = fmt::format("connect: {}", std::strerror(so));
      return std::nullopt;
    }
  }
  auto hs_deadline = std::min(deadline, Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                           std::chrono::duration<double>(cfg.handshake_timeout_s)));
  Nonce mine = random_nonce();
  if (auto e = send_msg(fd.get(), hello_of(HsType::kHello, self, cfg, version, mine), hs_deadline); !e.empty()) {
    err = "sending hello: " + e;
    return std::nullopt;
  }
  std::vector<uint8_t> buf;
  if (auto e = recv_msg(fd.get(), buf, hs_deadline); !e.empty()) {
    err = "waiting for hello-ack: " + e;
    return std::nullopt;
  }
  auto fail = [&](const std::string& reason) -> std::optional<int> {
    spdlog::warn("transport: refusing {}: {}", peer.name(), reason);
    send_msg(fd.get(), reject_of(version, reason), Clock::now() + std::chrono::milliseconds(200));
    throw HandshakeError(fmt::format("handshake with {} failed: {}", peer.name(), reason));
  };
  HsDecoded d = decode_handshake(buf, version);
  if (!d.msg) return fail(d.error);
  if (d.msg->type == HsType::kReject)
    throw HandshakeError(fmt::format("refused by {}: {}", peer.name(), d.msg->reason));
  const HsMessage& ack = *d.msg;
  if (ack.type != HsType::kHelloAck) return fail("expected hello-ack");
  if (ack.site != peer.site || ack.rank != peer.rank)
    return fail(fmt::format("dialed {} but {}/{} answered", peer.name(), ack.site, ack.rank));
  if (auto e = hello_mismatch(ack, self, cfg); !e.empty()) return fail(e);
  HsTranscript t = gate_transcript(self, true, peer.site, peer.rank, mine, ack.nonce);
  if (!mac_equal(ack.mac, compute_mac(cfg.psk, t, "listener")))
    return fail("authentication failed: the listener's HMAC does not verify (different pre-shared key?)");
  HsMessage auth;
  auth.version = version;
  auth.type = HsType::kAuth;
  auth.mac = compute_mac(cfg.psk, t, "dialer");
  if (auto e = send_msg(fd.get(), auth, hs_deadline); !e.empty()) {
    err = "sending auth: " + e;
    return std::nullopt;
  }
  if (auto e = recv_msg(fd.get(), buf, hs_deadline); !e.empty()) {
    err = "waiting for auth-ok: " + e;
    return std::nullopt;
  }
  d = decode_handshake(buf, version);
  if (!d.msg) return fail(d.error);
  if (d.msg->type == HsType::kReject)
    throw HandshakeError(fmt::format("refused by {}: {}", peer.name(), d.msg->reason));
  if (d.msg->type != HsType::kAuthOk || d.msg->port == 0 || d.msg->port > 65535) return fail("bad auth-ok");
  return static_cast<int>(d.msg->port);
}

}  // namespace

int gate_dial(const PeerInfo& peer, const Identity& self, const TransportConfig& cfg, uint16_t version,
              Clock::time_point deadline) {
  std::string last = "no attempt";
  while (Clock::now() < deadline) {
    std::string err;
    if (auto port = gate_attempt(peer, self, cfg, version, deadline, err)) return *port;
    last = err;
    auto retry = Clock::now() + std::chrono::milliseconds(200);
    std::this_thread::sleep_until(std::min(retry, deadline));
  }
  throw TimeoutError(fmt::format("{} ({})", peer.name(), last));
}

}  // namespace geoloco::transport

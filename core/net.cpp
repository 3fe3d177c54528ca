#include "core/net.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <thread>

#include "core/error.hpp"

namespace geoloco::net {

namespace {

// Milliseconds poll() may wait for `deadline`: -1 for kNoDeadline, 0 once it passed, and at
// most ~16 min per call (poll_until polls again while the deadline is still ahead).
int poll_timeout_ms(Clock::time_point deadline) {
  if (deadline == kNoDeadline) return -1;
  const auto now = Clock::now();
  if (deadline <= now) return 0;
  // Round up: a wait of 0.3 ms must not turn into a busy poll(0) loop until the deadline.
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - now).count();
  return static_cast<int>(std::min<int64_t>(left, 1'000'000));
}

struct AddrInfoDeleter {
  void operator()(addrinfo* p) const { ::freeaddrinfo(p); }
};
using AddrInfoPtr = std::unique_ptr<addrinfo, AddrInfoDeleter>;

AddrInfoPtr resolve(const std::string& host, int port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  const int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &res);
  if (rc != 0) throw Error(fmt::format("cannot resolve {}:{}: {}", host, port, ::gai_strerror(rc)));
  return AddrInfoPtr(res);
}

std::string address_text(const sockaddr_storage& ss) {
  char ip[INET6_ADDRSTRLEN] = "?";
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    ::inet_ntop(AF_INET, &a->sin_addr, ip, sizeof(ip));
    return fmt::format("{}:{}", ip, ntohs(a->sin_port));
  }
  if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    ::inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof(ip));
    return fmt::format("[{}]:{}", ip, ntohs(a->sin6_port));
  }
  return "?";
}

// Waits for `events` on one descriptor; IoResult::ok() when it is ready (or has an error
// or hang-up pending, which the next send/recv then reports).
IoResult wait_ready(int fd, short events, Clock::time_point deadline, size_t done) {
  pollfd p{fd, events, 0};
  const int rc = poll_until({&p, 1}, deadline);
  if (rc > 0) return {IoStatus::kOk, done, 0};
  if (rc == 0) return {IoStatus::kTimedOut, done, 0};
  return {IoStatus::kError, done, errno};
}

bool transient(int e) { return e == EINTR || e == EAGAIN || e == EWOULDBLOCK; }

}  // namespace

int poll_until(std::span<pollfd> fds, Clock::time_point deadline) {
  for (;;) {
    const int ms = poll_timeout_ms(deadline);
    const int rc = ::poll(fds.data(), fds.size(), ms);
    if (rc > 0) return rc;
    if (rc < 0 && errno != EINTR) return -1;
    // Timed out (possibly early: the per-call cap) or interrupted: wait for what is left.
    if (rc == 0 && ms == 0) return 0;
    if (rc == 0 && Clock::now() >= deadline) return 0;
  }
}

std::string IoResult::message() const {
  switch (status) {
    case IoStatus::kOk: return "";
    case IoStatus::kTimedOut: return "timed out";
    case IoStatus::kClosed: return "connection closed by peer";
    case IoStatus::kError: return std::strerror(error);
  }
  return "unknown I/O status";
}

IoResult send_all(int fd, const void* data, size_t len, Clock::time_point deadline) {
  const char* p = static_cast<const char*>(data);
  size_t done = 0;
  while (done < len) {
    // Try first, wait only when the socket buffer is full: a send that fits costs no poll.
    const ssize_t n = ::send(fd, p + done, len - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && !transient(errno)) return {IoStatus::kError, done, errno};
    if (IoResult w = wait_ready(fd, POLLOUT, deadline, done); !w.ok()) return w;
  }
  return {IoStatus::kOk, done, 0};
}

IoResult recv_all(int fd, void* data, size_t len, Clock::time_point deadline) {
  char* p = static_cast<char*>(data);
  size_t done = 0;
  while (done < len) {
    const ssize_t n = ::recv(fd, p + done, len - done, MSG_DONTWAIT);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return {IoStatus::kClosed, done, 0};
    if (!transient(errno)) return {IoStatus::kError, done, errno};
    if (IoResult w = wait_ready(fd, POLLIN, deadline, done); !w.ok()) return w;
  }
  return {IoStatus::kOk, done, 0};
}

std::string route_source_address(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* raw = nullptr;
  if (const int rc = ::getaddrinfo(host.c_str(), "9", &hints, &raw); rc != 0)
    throw Error(fmt::format("finding this node's address: '{}' does not resolve to IPv4: {}", host, gai_strerror(rc)));
  AddrInfoPtr ai(raw);
  Fd fd(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!fd) throw Error(fmt::format("finding this node's address: socket: {}", std::strerror(errno)));
  if (::connect(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0)
    throw Error(fmt::format("finding this node's address: no route to {}: {}", host, std::strerror(errno)));
  sockaddr_in local{};
  socklen_t len = sizeof local;
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&local), &len) != 0)
    throw Error(fmt::format("finding this node's address: getsockname: {}", std::strerror(errno)));
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &local.sin_addr, text, sizeof text);
  return text;
}

ConnectResult try_connect(const std::string& host, int port, Clock::time_point deadline) {
  ConnectResult out;
  out.error = "no address";
  AddrInfoPtr ai = resolve(host, port, false);
  for (addrinfo* a = ai.get(); a != nullptr; a = a->ai_next) {
    Fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol));
    if (!fd) {
      out.error = std::strerror(errno);
      continue;
    }
    if (::connect(fd.get(), a->ai_addr, a->ai_addrlen) != 0) {
      if (errno != EINPROGRESS && errno != EINTR) {
        out.error = std::strerror(errno);
        continue;
      }
      // In progress (or interrupted, which on Linux also goes on asynchronously).
      pollfd p{fd.get(), POLLOUT, 0};
      const int rc = poll_until({&p, 1}, deadline);
      if (rc <= 0) {
        out.error = rc == 0 ? "timed out" : std::strerror(errno);
        continue;
      }
      int err = 0;
      socklen_t len = sizeof(err);
      if (::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
      if (err != 0) {
        out.error = std::strerror(err);
        continue;
      }
    }
    set_nonblocking(fd.get(), false);
    set_nodelay(fd.get());
    out.fd = std::move(fd);
    out.error.clear();
    return out;
  }
  return out;
}

ConnectResult connect_until(const std::string& host, int port, Clock::time_point deadline,
                            std::chrono::milliseconds attempt, std::chrono::milliseconds pause) {
  for (;;) {
    ConnectResult r = try_connect(host, port, std::min(deadline, Clock::now() + attempt));
    if (r.fd || Clock::now() >= deadline) return r;
    std::this_thread::sleep_until(std::min(deadline, Clock::now() + pause));
    if (Clock::now() >= deadline) return r;
  }
}

Fd listen_tcp(const std::string& host, int port, int backlog) {
  AddrInfoPtr ai = resolve(host, port, true);
  std::string last = "no address";
  for (addrinfo* a = ai.get(); a != nullptr; a = a->ai_next) {
    Fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (!fd) {
      last = std::strerror(errno);
      continue;
    }
    int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd.get(), a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd.get(), backlog) != 0) {
      last = std::strerror(errno);
      continue;
    }
    return fd;
  }
  throw Error(fmt::format("cannot listen on {}:{}: {}", host, port, last));
}

int local_port(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0)
    throw Error(fmt::format("getsockname: {}", std::strerror(errno)));
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  throw Error("getsockname: unexpected address family");
}

Accepted accept_until(int listen_fd, Clock::time_point deadline, bool nonblocking) {
  Accepted out;
  const int flags = SOCK_CLOEXEC | (nonblocking ? SOCK_NONBLOCK : 0);
  for (;;) {
    pollfd p{listen_fd, POLLIN, 0};
    const int rc = poll_until({&p, 1}, deadline);
    if (rc == 0) {
      out.error = "timed out";
      out.timed_out = true;
      return out;
    }
    if (rc < 0) {
      out.error = std::strerror(errno);
      return out;
    }
    // poll said a connection is queued, so accept4 returns at once even on a blocking
    // listener (Linux keeps a connection reset meanwhile in the queue and hands it over),
    // unless another thread accepts on the same listener: share only non-blocking ones.
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    const int fd = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&ss), &len, flags);
    if (fd >= 0) {
      out.fd.reset(fd);
      out.peer = address_text(ss);
      return out;
    }
    if (!transient(errno) && errno != ECONNABORTED) {
      out.error = std::strerror(errno);
      return out;
    }
    if (Clock::now() >= deadline) {
      out.error = "timed out";
      out.timed_out = true;
      return out;
    }
  }
}

std::string peer_address(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  return address_text(ss);
}

void set_nonblocking(int fd, bool on) {
  int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags < 0) throw Error(fmt::format("fcntl(F_GETFL): {}", std::strerror(errno)));
  flags = on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK);
  if (::fcntl(fd, F_SETFL, flags) < 0) throw Error(fmt::format("fcntl(F_SETFL): {}", std::strerror(errno)));
}

void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

std::string seconds_text(std::chrono::milliseconds ms) {
  if (ms.count() % 1000 == 0) return fmt::format("{} s", ms.count() / 1000);
  return fmt::format("{:g} s", ms.count() / 1000.0);
}

}  // namespace geoloco::net

#include "trainer/parallel/socket.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "trainer/core/error.hpp"

namespace geoloco::parallel::net {

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) reset(o.release());
  return *this;
}

void Fd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

void set_nonblocking(int fd, bool on) {
  int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags < 0) throw Error(fmt::format("fcntl(F_GETFL): {}", std::strerror(errno)));
  flags = on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK);
  if (::fcntl(fd, F_SETFL, flags) < 0) throw Error(fmt::format("fcntl(F_SETFL): {}", std::strerror(errno)));
}

std::string seconds_text(std::chrono::milliseconds ms) {
  if (ms.count() % 1000 == 0) return fmt::format("{} s", ms.count() / 1000);
  return fmt::format("{:g} s", ms.count() / 1000.0);
}

namespace {

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
  int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &res);
  if (rc != 0) throw Error(fmt::format("cannot resolve {}:{}: {}", host, port, ::gai_strerror(rc)));
  return AddrInfoPtr(res);
}

int remaining_ms(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  if (left <= 0) return 0;
  return left > 1'000'000 ? 1'000'000 : static_cast<int>(left);
}

// Waits for `events` on fd until the deadline; "" when ready.
std::string wait_fd(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    int ms = remaining_ms(deadline);
    int rc = ::poll(&p, 1, ms);
    if (rc > 0) return "";
    if (rc == 0) return "timed out";
    if (errno != EINTR) return std::strerror(errno);
  }
}

}  // namespace

ConnectResult try_connect(const std::string& host, int port, Clock::time_point deadline) {
  ConnectResult out;
  AddrInfoPtr ai = resolve(host, port, false);
  for (addrinfo* a = ai.get(); a != nullptr; a = a->ai_next) {
    Fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (!fd.valid()) {
      out.error = std::strerror(errno);
      continue;
    }
    set_nonblocking(fd.get(), true);
    int rc = ::connect(fd.get(), a->ai_addr, a->ai_addrlen);
    if (rc != 0 && errno != EINPROGRESS) {
      out.error = std::strerror(errno);
      continue;
    }
    if (rc != 0) {
      std::string w = wait_fd(fd.get(), POLLOUT, deadline);
      if (!w.empty()) {
        out.error = w;
        continue;
      }
      int err = 0;
      socklen_t len = sizeof(err);
      ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) {
        out.error = std::strerror(err);
        continue;
      }
    }
    set_nonblocking(fd.get(), false);
    int one = 1;
    ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    out.fd = std::move(fd);
    out.error.clear();
    return out;
  }
  return out;
}

Fd listen_tcp(const std::string& host, int port, int backlog) {
  AddrInfoPtr ai = resolve(host, port, true);
  std::string last = "no address";
  for (addrinfo* a = ai.get(); a != nullptr; a = a->ai_next) {
    Fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (!fd.valid()) {
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

std::string send_all(int fd, const void* data, size_t len, Clock::time_point deadline) {
  const char* p = static_cast<const char*>(data);
  while (len > 0) {
    std::string w = wait_fd(fd, POLLOUT, deadline);
    if (!w.empty()) return w;
    ssize_t n = ::send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return std::strerror(errno);
    }
    p += n;
    len -= static_cast<size_t>(n);
  }
  return "";
}

std::string recv_all(int fd, void* data, size_t len, Clock::time_point deadline) {
  char* p = static_cast<char*>(data);
  while (len > 0) {
    std::string w = wait_fd(fd, POLLIN, deadline);
    if (!w.empty()) return w;
    ssize_t n = ::recv(fd, p, len, MSG_DONTWAIT);
    if (n == 0) return "connection closed by peer";
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return std::strerror(errno);
    }
    p += n;
    len -= static_cast<size_t>(n);
  }
  return "";
}

}  // namespace geoloco::parallel::net

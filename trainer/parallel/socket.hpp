// Minimal blocking-with-deadline TCP helpers for the rendezvous store. Every call takes a
// deadline: nothing here can hang past it (poll() bounds each wait).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace geoloco::parallel::net {

using Clock = std::chrono::steady_clock;

// Owns one file descriptor; closes it on destruction.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// Outcome of one connect attempt; `error` holds strerror text when !fd.valid().
struct ConnectResult {
  Fd fd;
  std::string error;
};

// One non-blocking connect attempt to host:port bounded by `deadline`. Never throws for
// network errors (the caller retries); throws geoloco::Error when host does not resolve.
ConnectResult try_connect(const std::string& host, int port, Clock::time_point deadline);

// Listening socket bound to host:port (SO_REUSEADDR so a restarted run can rebind at once);
// port 0 picks a free port. Throws geoloco::Error naming the address on failure.
Fd listen_tcp(const std::string& host, int port, int backlog = 256);
// The port a bound socket actually listens on.
int local_port(int fd);

// Send/receive exactly `len` bytes before `deadline`. Return "" on success, otherwise a
// short reason ("timed out", "connection closed by peer", strerror text).
std::string send_all(int fd, const void* data, size_t len, Clock::time_point deadline);
std::string recv_all(int fd, void* data, size_t len, Clock::time_point deadline);

void set_nonblocking(int fd, bool on);

// "5 s", "0.25 s": durations in error messages.
std::string seconds_text(std::chrono::milliseconds ms);

}  // namespace geoloco::parallel::net

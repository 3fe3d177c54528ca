// geoloco::net: blocking-with-deadline TCP helpers, the one implementation every area uses
// (rendezvous store, NCCL bootstrap, WAN ping-pong, the transport's gate). Every call that
// waits takes a deadline: nothing here can block past it (poll() bounds each wait), and a
// signal (EINTR) only makes it wait again for the time left, never fails it.
//
// Errors: the calls a caller retries (connect, accept, send/recv) return what happened as a
// value with a short text ("timed out", "connection closed by peer", strerror text) for the
// caller to put into its own typed error; setup calls that cannot be retried (listen,
// getsockname, fcntl, a host that does not resolve) throw geoloco::Error naming the address.
#pragma once

#include <poll.h>

#include <chrono>
#include <cstddef>
#include <span>
#include <string>

#include "core/fd.hpp"

namespace geoloco::net {

using Clock = std::chrono::steady_clock;

// A deadline that never comes: poll_until(fds, kNoDeadline) waits as long as it takes.
inline constexpr Clock::time_point kNoDeadline = Clock::time_point::max();

// poll(2) until `deadline`, polling again with the time left after EINTR. Returns what
// poll() returns: the number of descriptors with revents (> 0), 0 when the deadline passed
// first, -1 with errno set on any other failure (never EINTR).
int poll_until(std::span<pollfd> fds, Clock::time_point deadline);

// Outcome of send_all/recv_all.
enum class IoStatus {
  kOk,        // all `len` bytes moved
  kTimedOut,  // the deadline passed first
  kClosed,    // recv: the peer closed the connection (orderly EOF)
  kError,     // a socket error; `error` holds errno (ECONNRESET, EPIPE, ...)
};

struct IoResult {
  IoStatus status = IoStatus::kOk;
  size_t bytes = 0;  // bytes moved before the call returned (all of them when ok)
  int error = 0;     // errno, for kError

  bool ok() const { return status == IoStatus::kOk; }
  // "" when ok, else "timed out", "connection closed by peer" or the strerror text.
  std::string message() const;
};

// Sends/receives exactly `len` bytes on a socket (blocking or not) before `deadline`,
// across as many partial transfers as the kernel makes of it. send_all never raises SIGPIPE
// (a closed peer is kError with EPIPE). Neither touches the descriptor's O_NONBLOCK flag.
IoResult send_all(int fd, const void* data, size_t len, Clock::time_point deadline);
IoResult recv_all(int fd, void* data, size_t len, Clock::time_point deadline);

// Outcome of one connect attempt; `error` ("timed out", strerror text) when !fd.valid().
struct ConnectResult {
  Fd fd;
  std::string error;
};

// One non-blocking connect attempt to host:port (every address host resolves to, in turn)
// bounded by `deadline`. The connected socket is blocking again, close-on-exec and has
// TCP_NODELAY set. Never throws for network errors (the caller retries); throws
// geoloco::Error when host does not resolve.
ConnectResult try_connect(const std::string& host, int port, Clock::time_point deadline);

// try_connect again and again until one attempt succeeds or `deadline` passes: each attempt
// is bounded by `attempt` (so one black-holed SYN does not eat the whole budget), `pause`
// apart. When none succeeds, `error` is the last attempt's.
ConnectResult connect_until(const std::string& host, int port, Clock::time_point deadline,
                            std::chrono::milliseconds attempt = std::chrono::seconds(1),
                            std::chrono::milliseconds pause = std::chrono::milliseconds(50));

// Listening socket bound to host:port (SO_REUSEADDR, so a restarted run can rebind its port
// at once; close-on-exec); port 0 picks a free port, see local_port(). Throws geoloco::Error
// "cannot listen on HOST:PORT: reason".
Fd listen_tcp(const std::string& host, int port, int backlog = 256);

// The port a bound socket listens on (or is bound to).
int local_port(int fd);

// Outcome of accept_until: the connection and who it is from ("ip:port"), or `error`
// ("timed out", strerror text) when !fd.valid().
struct Accepted {
  Fd fd;
  std::string peer;
  std::string error;
  bool timed_out = false;  // no connection came before the deadline
};

// Waits until `deadline` for a connection on `listen_fd` and accepts it (close-on-exec;
// non-blocking when `nonblocking`). Clock::now() as the deadline accepts only a connection
// that is already waiting (after poll_until said the listener is readable).
Accepted accept_until(int listen_fd, Clock::time_point deadline, bool nonblocking = false);

// The local IPv4 address this host's routing table uses to reach `host` (a dotted IPv4
// address or a name): a UDP socket connected to it (no packet is sent) and its own address
// read back. The address a rank binds when it finds its own (a site across nodes, whose
// config names only node 0's address). Throws geoloco::Error naming `host` and the failure.
std::string route_source_address(const std::string& host);

// "ip:port" of a socket's peer ("?" when the socket has none).
std::string peer_address(int fd);

// O_NONBLOCK on or off; throws geoloco::Error when fcntl fails.
void set_nonblocking(int fd, bool on);

// TCP_NODELAY on: small request/response messages go out at once (best effort).
void set_nodelay(int fd);

// "5 s", "0.25 s": durations in error messages.
std::string seconds_text(std::chrono::milliseconds ms);

}  // namespace geoloco::net

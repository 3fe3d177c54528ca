// The gate: geoloco's own TCP listener on the configured (public) port.
//
// Why it exists: UCX 1.13's sockaddr connection manager aborts the whole process
// (tcp_sockcm_ep.c assertion) when a stranger sends malformed bytes to a UCX listener. So the
// configured port is served by this small, fully bounds-checked TCP server instead. A dialer
// must pass the same HMAC-PSK handshake as on the UCX lanes (transcript lane kGateLane, so
// MACs are not interchangeable) before the gate tells it the port of the UCX listener, which
// is bound to an ephemeral port on the same address. Garbage, slow or refused clients cost
// one short-lived thread each (at most kMaxGateClients at once) and never touch UCX.
//
// Wire: each message is u16 little-endian length (<= kMaxHandshakeBytes) + a handshake
// message (handshake.hpp); every read has the handshake deadline. A handshake on the directory
// lane (kDirectoryLane) is followed by the site directory (site_directory.hpp) instead. The protocol itself is
// HandshakeSession's (handshake_session.hpp), the same the UCX lanes run.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/fd.hpp"
#include "transport/handshake_session.hpp"
#include "transport/peer.hpp"

namespace geoloco::transport::ucx {

inline constexpr int kMaxGateClients = 16;

class Gate {
 public:
  // Binds host:port (0 = pick one) and starts serving; `ucx_port` is revealed to peers that
  // authenticate.
  Gate(const std::string& host, int port, HsLocal local, double handshake_timeout_s, int ucx_port);
  ~Gate();
  Gate(const Gate&) = delete;
  Gate& operator=(const Gate&) = delete;

  int port() const { return port_; }
  // Until this is called, hellos wait (up to the handshake deadline) for the peer list.
  void set_peers(const std::vector<PeerInfo>& peers);
  // Rank 0 of a site whose ranks found their own addresses: from now on the gate answers a
  // directory request (kDirectoryLane, any rank of another site that passes the handshake;
  // it needs no peer list) with these addresses, one per rank (site_directory.hpp).
  void set_directory(std::vector<std::string> addresses);
  // From now on a known peer may dial us whatever the dial rule says: a process rejoining the
  // running job (the UCX lanes check that its old connection is gone).
  void open_to_joiners() { joiners_.store(true); }
  // Latest refusal reason per claimed peer "site/rank", for the connect-timeout message.
  std::string refusal_for(const std::string& site, int rank) const;
  uint64_t refused() const { return refused_.load(); }

 private:
  void accept_loop();
  void serve(Fd fd, std::string remote);
  void refuse(int fd, const std::string& remote, const std::string& claimed, const std::string& reason);

  HsLocal local_;
  double handshake_timeout_s_;
  int ucx_port_;
  Fd listen_fd_;
  Fd stop_fd_;
  int port_ = 0;
  std::thread acceptor_;
  std::atomic<uint64_t> refused_{0};
  std::atomic<int> active_{0};

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::optional<std::vector<PeerInfo>> peers_;
  std::optional<std::vector<uint8_t>> directory_;  // encoded (site_directory.hpp)
  std::map<std::string, std::string> refusals_;
  struct Client {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::vector<Client> clients_;  // finished ones are joined by the acceptor (no leak under a flood)
  bool stopping_ = false;
  std::atomic<bool> joiners_{false};
};

// Dialer side: authenticates with `peer`'s gate and returns its UCX listener port. Retries
// refused/reset TCP connections until `deadline` (the peer may start later). Throws
// HandshakeError when the peer refused us or failed authentication (retrying cannot help),
// TimeoutError at the deadline (message has the last error). `unreachable_s` > 0: gives up
// (TimeoutError) when no TCP connection could be opened for that long -- a joiner's peer
// whose process is not there.
int gate_dial(const PeerInfo& peer, const HsLocal& local, double handshake_timeout_s,
              std::chrono::steady_clock::time_point deadline, double unreachable_s = 0);

// Asks `rank0` (rank 0 of another site, at its gate) for its site's directory: the address of
// each of its `ranks` ranks. Retries as gate_dial does until `deadline` (TimeoutError, with
// the last error); throws HandshakeError when refused, TransportError for a malformed answer.
std::vector<std::string> gate_directory(const PeerInfo& rank0, int ranks, const HsLocal& local,
                                        double handshake_timeout_s, std::chrono::steady_clock::time_point deadline);

}  // namespace geoloco::transport::ucx

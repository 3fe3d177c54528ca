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
// message (handshake.hpp); every read has the handshake deadline.
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

#include "transport/handshake.hpp"
#include "transport/peer.hpp"
#include "transport/transport_config.hpp"

namespace geoloco::transport {

inline constexpr uint16_t kGateLane = 0xFFFF;
inline constexpr int kMaxGateClients = 16;

// Fields both sides must agree on; "" when a peer's hello matches ours.
std::string hello_mismatch(const HsMessage& m, const Identity& self, const TransportConfig& cfg);

class Gate {
 public:
  // Binds host:port (0 = pick one) and starts serving; `ucx_port` is revealed to peers that
  // authenticate.
  Gate(const std::string& host, int port, const Identity& self, const TransportConfig& cfg, uint16_t version,
       int ucx_port);
  ~Gate();
  Gate(const Gate&) = delete;
  Gate& operator=(const Gate&) = delete;

  int port() const { return port_; }
  // Until this is called, hellos wait (up to the handshake deadline) for the peer list.
  void set_peers(const std::vector<PeerInfo>& peers);
  // Latest refusal reason per claimed peer "site/rank", for the connect-timeout message.
  std::string refusal_for(const std::string& site, int rank) const;
  uint64_t refused() const { return refused_.load(); }

 private:
  void accept_loop();
  void serve(int fd, std::string remote);
  void refuse(int fd, const std::string& remote, const std::string& claimed, const std::string& reason);

  Identity self_;
  TransportConfig cfg_;
  uint16_t version_;
  int ucx_port_;
  int listen_fd_ = -1;
  int stop_fd_ = -1;
  int port_ = 0;
  std::thread acceptor_;
  std::atomic<uint64_t> refused_{0};
  std::atomic<int> active_{0};

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::optional<std::vector<PeerInfo>> peers_;
  std::map<std::string, std::string> refusals_;
  struct Client {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::vector<Client> clients_;  // finished ones are joined by the acceptor (no leak under a flood)
  bool stopping_ = false;
};

// Dialer side: authenticates with `peer`'s gate and returns its UCX listener port. Retries
// refused/reset TCP connections until `deadline` (the peer may start later). Throws
// HandshakeError when the peer refused us or failed authentication (retrying cannot help),
// TimeoutError at the deadline (message has the last error).
int gate_dial(const PeerInfo& peer, const Identity& self, const TransportConfig& cfg, uint16_t version,
              std::chrono::steady_clock::time_point deadline);

}  // namespace geoloco::transport

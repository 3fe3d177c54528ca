// geoloco::transport::Transport: one per rank. Owns one UCX worker driven by one internal
// progress thread (all UCX calls happen there, UCS_THREAD_MODE_SINGLE); the public API is
// thread-safe and asynchronous. Rank r of a site exchanges chunked, checksummed frames with
// rank r of every other site over `lanes` authenticated endpoints per peer.
//
// Life cycle:  Transport t(cfg, self);  int port = t.listen(host, port);
//              t.connect(peers);   // all peers connected + authenticated, or throws
//              auto s = t.send(p, kind, round, shard, bytes);  auto r = t.recv(...);
//              s.wait(); r.wait();  // throw TransportError / FrameError / TimeoutError
// Error semantics (README.md): any failure with a peer -- death, timeout, protocol violation
// -- breaks that peer: its pending and future operations fail with the first error, which
// names the peer. Other peers are unaffected. Buffers passed to send/recv must stay alive
// until the handle is ready (a failed handle becomes ready only after UCX has let go).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "transport/frame.hpp"
#include "transport/peer.hpp"
#include "transport/transport_config.hpp"
#include "transport/transport_error.hpp"

namespace geoloco::transport {

struct PeerStats {
  std::string site;
  int rank = 0;
  uint64_t bytes_sent = 0;      // payload bytes whose send completed
  uint64_t bytes_received = 0;  // payload bytes received and checksum-verified
  uint64_t frames_sent = 0;
  uint64_t frames_received = 0;
  uint64_t frames_rejected = 0;
  uint64_t frames_received_rndv = 0;   // of frames_received: payload pulled by rendezvous
  uint64_t messages_sent_eager = 0;    // messages counted in the eager window (all chunks eager)
  uint64_t eager_bytes_outstanding = 0;  // of those, bytes the peer has not credited back yet
  std::vector<uint64_t> lane_bytes_sent;  // bytes_sent split by lane (index = lane)
  std::string failure;  // empty while the peer is healthy
};

struct TransportStats {
  std::vector<PeerStats> peers;
  uint64_t handshakes_refused = 0;          // UCX lanes we refused or that refused us
  uint64_t gate_refused = 0;                // gate connections refused (garbage, bad key, ...)
  uint64_t frames_rejected_unauthenticated = 0;  // frames on endpoints not (yet) authenticated
  nlohmann::json to_json() const;
};

// Test-only hooks. `tamper` sees every outgoing chunk (decoded header + payload) and returns
// the frames to send instead: header bytes (any size) + payload bytes. Returning {} drops the
// chunk, two entries replay it.
struct TamperedFrame {
  std::vector<uint8_t> header;
  std::vector<uint8_t> payload;
};
struct TestHooks {
  uint16_t protocol_version = 0;  // 0 = the real one
  std::function<std::vector<TamperedFrame>(const FrameHeader&, std::span<const uint8_t>)> tamper;
};

namespace detail {
struct OpState;
}

// Handle of one asynchronous send or recv. Copyable (shared state).
class OpHandle {
 public:
  OpHandle() = default;
  explicit OpHandle(std::shared_ptr<detail::OpState> s) : s_(std::move(s)) {}
  // Blocks until done; throws the operation's error.
  void wait() const;
  // True when done (throws the error if it failed), false if `timeout` passed first.
  bool wait_for(std::chrono::duration<double> timeout) const;
  // Done (successfully or not); never throws.
  bool ready() const;
  // Payload bytes of the transfer (for a recv: the total the sender announced). Valid when done.
  uint64_t bytes() const;

 private:
  std::shared_ptr<detail::OpState> s_;
};
using SendHandle = OpHandle;
using RecvHandle = OpHandle;

class Transport {
 public:
  Transport(TransportConfig config, Identity self, TestHooks hooks = {});
  ~Transport();
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  // Starts listening on host:port (IPv4; port 0 picks a free port). Returns the bound port.
  // That port is served by geoloco's gate (gate.hpp); UCX itself listens on an ephemeral
  // port of the same address, revealed only to authenticated peers.
  int listen(const std::string& host, int port);
  // Connects to and authenticates with every peer (lanes endpoints each) within
  // connect_timeout_s. The smaller (site, rank) dials, the other accepts; dials are retried
  // until the deadline. Throws HandshakeError when a peer refused us or we refused it for a
  // reason that retrying cannot fix, TransportError naming every missing peer at the deadline.
  void connect(std::vector<PeerInfo> peers);
  // listen() then connect().
  void start(const std::string& host, int port, std::vector<PeerInfo> peers);

  const Identity& self() const;
  const std::vector<PeerInfo>& peers() const;
  // Index into peers() of (site, rank), or -1.
  int peer_index(const std::string& site, int rank) const;

  // Asynchronous, thread-safe. A (peer, kind, round, shard) key may have at most one send
  // and one recv outstanding; the recv's dest may be larger than the transfer (bytes() says
  // how much arrived). Bytes of dest outside [0, bytes()) are never written; on failure the
  // contents of dest are unspecified.
  SendHandle send(int peer, FrameKind kind, uint64_t round, uint32_t shard, std::span<const uint8_t> payload);
  RecvHandle recv(int peer, FrameKind kind, uint64_t round, uint32_t shard, std::span<uint8_t> dest);
  // As send(), but every chunk travels on lane `lane` (0 <= lane < lanes()) instead of
  // round-robin over all of them: one TCP connection's throughput (geoloco probe). The
  // receiver does not see a difference. A lane outside the range fails the handle at once.
  SendHandle send_on_lane(int peer, int lane, FrameKind kind, uint64_t round, uint32_t shard,
                          std::span<const uint8_t> payload);

  // Endpoints (TCP connections) per peer: the configured lanes.
  int lanes() const;
  // Lanes plain send() spreads its chunks over, the first n of lanes() (default: all).
  // outer.plan: auto uses the fewest that reach its target; the other connections stay up.
  // Takes effect for transfers posted afterwards. TransportError outside [1, lanes()].
  void set_active_lanes(int n);
  int active_lanes() const;

  TransportStats stats() const;
  // UCX settings applied at startup ("NAME=value"), for logs and summaries.
  std::vector<std::string> ucx_settings() const;

  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace geoloco::transport

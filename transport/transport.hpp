// geoloco::transport::Transport: how a rank of one site exchanges messages with the ranks of
// the other sites it is given (rank r of every other site when the sites have one rank count;
// outer_optimizer/exchange_layout.hpp otherwise), whatever carries them. Two backends implement it:
//   * UcxTransport (transport/ucx/): UCX active messages over TCP, the WAN path;
//   * MemoryTransport (transport/memory/): an in-memory fabric for tests, with deterministic
//     delivery and injectable faults (drop, delay, corrupt, garbage, stall, kill).
// Both run the same protocol (channel.hpp: framing, reassembly, credits, deadlines) and the
// same handshake (handshake_session.hpp).
//
// Messages are keyed by (peer, kind, round, shard). The API is thread-safe and
// asynchronous: send()/recv() return handles at once; an operation owns its buffer until it
// completes (op.hpp), so callers may drop handles at any time.
//
// Error semantics (README.md): any failure with a peer -- death, a transfer making no
// progress, a protocol violation -- breaks that peer: its pending and later operations fail
// with the first error, which names the peer. Other peers are unaffected. Cancelling
// (OpHandle::cancel, cancel(peer)) completes operations with CancelledError and breaks
// nothing: a peer's departure is an event the caller recovers from.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "transport/frame.hpp"
#include "transport/op.hpp"
#include "transport/peer.hpp"
#include "transport/stats.hpp"
#include "transport/test_hooks.hpp"
#include "transport/transport_config.hpp"
#include "transport/transport_error.hpp"

namespace geoloco::transport {

class Transport {
 public:
  virtual ~Transport() = default;

  virtual const Identity& self() const = 0;
  // The peers given to connect(), in that order (valid once connected).
  virtual const std::vector<PeerInfo>& peers() const = 0;
  // Index into peers() of (site, rank), or -1.
  int peer_index(const std::string& site, int rank) const;

  // A (peer, kind, round, shard) key may have at most one send and one receive outstanding.
  // The send owns `payload` until it completes.
  virtual SendHandle send(int peer, FrameKind kind, uint64_t round, uint32_t shard, Payload payload) = 0;
  // As send(), but every chunk travels on lane `lane` (0 <= lane < lanes()) instead of
  // round-robin over the active lanes: one TCP connection's throughput (geoloco probe). The
  // receiver does not see a difference. A lane outside the range fails the handle at once.
  virtual SendHandle send_on_lane(int peer, int lane, FrameKind kind, uint64_t round, uint32_t shard,
                                  Payload payload) = 0;
  // Receives into `buffer`, which may be larger than the transfer (bytes() says how much
  // arrived; take() gives the buffer back). Bytes outside [0, bytes()) are never written.
  virtual RecvHandle recv(int peer, FrameKind kind, uint64_t round, uint32_t shard, std::vector<uint8_t> buffer) = 0;
  RecvHandle recv(int peer, FrameKind kind, uint64_t round, uint32_t shard, size_t max_bytes) {
    return recv(peer, kind, round, shard, std::vector<uint8_t>(max_bytes));
  }
  // Completes every pending operation with `peer` with CancelledError naming `reason`; frames
  // that still arrive for the cancelled receives are discarded. The connection stays up and
  // later operations with the peer work. Returns at once (the completions follow).
  virtual void cancel(int peer, const std::string& reason) = 0;
  // Messages of `kind` with a round below `before_round` and a shard of at least `min_shard`
  // are no longer wanted from any peer: frames of them held for a receive not yet posted are
  // released, and later ones are discarded on arrival (frames_discarded). For protocols whose
  // late messages would otherwise pile up (a decided round's membership messages). Receives
  // already posted are not affected. Returns at once.
  virtual void expire(FrameKind kind, uint64_t before_round, uint32_t min_shard) = 0;

  // Endpoints (TCP connections) per peer: the configured lanes.
  virtual int lanes() const = 0;
  // Lanes plain send() spreads its chunks over, the first n of lanes() (default: all).
  // outer.plan: auto uses the fewest that reach its target; the other connections stay up.
  // Takes effect for transfers posted afterwards. TransportError outside [1, lanes()].
  virtual void set_active_lanes(int n) = 0;
  virtual int active_lanes() const = 0;

  virtual TransportStats stats() const = 0;
  // How many times `peer` has connected: 1 after connect(), +1 each time a new process of that
  // site/rank rejoined after its connection failed or closed (README.md, "Rejoin"). A caller
  // that sees it grow knows its earlier operations with the peer went to a process that is
  // gone. 0 for a peer never connected (or an index out of range).
  virtual uint64_t generation(int peer) const = 0;
  // A peer whose connection failed while both processes live on (a cut long enough that its
  // transfers timed out): connect to it again, as at connect() -- only the side that dials
  // the peer there does (the other takes the connection in, as it takes a rejoining peer).
  // Returns at once; generation(peer) goes up once the new connection is in place. Does
  // nothing while the connection is up or the peer's side has not failed it yet (try again).
  virtual void redial(int /*peer*/) {}
  // Backend notes for logs and summaries (UCX: the settings applied at startup, "NAME=value").
  virtual std::vector<std::string> settings() const { return {}; }
};

// Convenience for sends of bytes the caller does not keep.
inline Payload payload_of(std::span<const uint8_t> bytes) {
  return make_payload(std::vector<uint8_t>(bytes.begin(), bytes.end()));
}

}  // namespace geoloco::transport

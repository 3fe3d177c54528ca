// Channel: the transfer protocol with one peer, as a state machine without I/O. Owns the
// peer's send queue (chunking, pipelining window, sender-side link emulation, the eager
// window and its credits), the reassembly of its receives (frame checks, chunk bitmap,
// checksums, frames that arrive before their receive, replay detection), its deadlines, its
// failure and the cancellation of its operations. The binding (Link) only moves frames.
//
// Everything here runs on the transport's loop thread. Frame checks happen in the order
// README.md ("Frames") gives, all before any copy or allocation sized by the peer.
//
// Failure: the first error with the peer (death, timeout, protocol violation) breaks the
// channel: its pending and later operations fail with that error. Cancellation does not
// break it: the cancelled operations complete with CancelledError, frames that still arrive
// for them are discarded (and their eager bytes credited back), later operations work.
// Either way an operation completes only once the binding returned every request that can
// touch its buffer (bounded by kCancelGraceS, after which the buffer is left to the
// request, never released under it).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "transport/frame.hpp"
#include "transport/link.hpp"
#include "transport/op.hpp"
#include "transport/peer.hpp"
#include "transport/stats.hpp"
#include "transport/test_hooks.hpp"
#include "transport/transport_config.hpp"

namespace geoloco::transport {

using Clock = std::chrono::steady_clock;
using Key = std::tuple<uint16_t, uint64_t, uint32_t>;  // kind, round, shard
std::string key_str(const Key& k);
Clock::duration seconds_d(double s);

// Frames held for receives not yet posted, per peer; each holds the binding's descriptor.
inline constexpr size_t kMaxUnexpectedFrames = 4096;
// Eager bytes held for receives not yet posted, per peer (rendezvous frames hold no payload).
inline constexpr uint64_t kMaxUnexpectedEagerBytes = 256ull << 20;
// A sender's eager window: this many times transport.eager_bytes sent eagerly and not yet
// credited back. The cap above catches a peer that ignores it.
inline constexpr uint64_t kEagerWindowFactor = 4;
static_assert(kEagerWindowFactor * kMaxEagerBytes <= kMaxUnexpectedEagerBytes);
// After a failure, how long an operation waits for the binding to return its requests.
inline constexpr double kCancelGraceS = 10;

struct SendOp {
  uint64_t id = 0;
  Key key;
  Payload payload;
  int lane = -1;  // -1: round-robin over the active lanes; else this lane only
  uint64_t nchunks = 0, next_chunk = 0, done_chunks = 0;
  int inflight = 0;
  bool eager = false;  // decided when its first chunk goes out: counted in the eager window
  Clock::time_point enqueued{};
  std::optional<Clock::time_point> next_release;  // emulation: when the next chunk may go
  FailKind fail = FailKind::kNone;
  std::string fail_msg;
  std::shared_ptr<detail::OpState> state;
};

struct RecvOp {
  uint64_t id = 0;
  Key key;
  std::shared_ptr<std::vector<uint8_t>> dest;
  bool have_total = false;
  uint64_t total = 0, nchunks = 0;
  uint64_t got = 0;       // chunks accepted (copied or fetch started)
  uint64_t verified = 0;  // chunks whose checksum matched
  std::vector<bool> seen;
  uint64_t credit_bytes = 0;  // bytes of eager-window frames: returned to the sender at the end
  int inflight = 0;           // fetches the binding has not completed
  Clock::time_point last_progress{};
  FailKind fail = FailKind::kNone;
  std::string fail_msg;
  Clock::time_point failed_at{};
  std::shared_ptr<detail::OpState> state;
};

class Channel {
 public:
  // `publish` runs right before an operation completes successfully, so a caller that saw the
  // completion also sees its bytes in the transport's stats.
  Channel(PeerInfo info, const TransportConfig& cfg, const TestHooks& hooks, Link& link, std::function<void()> publish);
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  const PeerInfo& info() const { return info_; }
  // Tells the channel whether the caller has posted a receive for a key that the loop thread
  // has not processed yet (any thread may call recv(); the post reaches the loop later). A
  // frame of a cancelled key that arrives in between belongs to that new receive and is held
  // for it, not discarded. Unset: frames of cancelled keys are always discarded.
  void set_recv_pending(std::function<bool(const Key&)> pending) { recv_pending_ = std::move(pending); }

  // ---- operations (from the API, via the loop) ----
  void post_send(std::shared_ptr<SendOp> op);
  void post_recv(std::shared_ptr<RecvOp> op);
  // Cancels one operation (by id) or every pending one; `reason` ends up in the error.
  void cancel(uint64_t id, const std::string& reason);
  void cancel_all(const std::string& reason);
  // Transport::expire: held frames of (kind, round < before, shard >= min_shard) released,
  // later ones discarded. One rule per (kind, min_shard); `before` only grows.
  void expire(uint16_t kind, uint64_t before, uint32_t min_shard);

  // ---- the binding ----
  // A frame arrived from this peer (on an authenticated lane).
  Disposition on_frame(std::span<const uint8_t> header, const HeldData& data);
  // Breaks the channel with its first error (quiet: not logged).
  void fail(FailKind kind, const std::string& msg, bool quiet = false);
  // The peer shut down cleanly: everything it sent has arrived (the UCX binding knows it from
  // the goodbye on every lane). What it sent is still delivered: a receive that holds all of
  // its chunks completes (fetches may be in flight), a message held whole for a receive not
  // posted yet completes that receive when it comes. Everything else fails with `msg`, as
  // does every later receive; once nothing deliverable is left the channel fails (quietly).
  void peer_closed(const std::string& msg);

  // ---- the loop ----
  // Issues chunks within the window; books the emulator's next release in `next`.
  bool pump(int active_lanes, Clock::time_point now, Clock::time_point& next);
  // Deadlines: fails the channel on a stalled transfer; books the next deadline in `next`.
  void check_timers(Clock::time_point now, Clock::time_point& next);
  // The teardown after fail(), outside any continuation: aborts the link, releases held
  // frames, completes what no request holds any more. True when there was one to do.
  bool process_failure();
  // Shutdown: completes whatever still waits on requests the binding will never return.
  void abandon_requests();

  // Failed, or closed by the peer (nothing more will come from it).
  bool failed() const { return failed_ || closed_; }
  FailKind fail_kind() const { return fail_kind_; }
  const std::string& failure() const { return failure_; }
  // Transfers posted or in flight.
  bool active() const { return !sendq_.empty() || !recvs_.empty() || inflight_ > 0; }
  // Requests the binding still holds (frames being sent, fetches in progress).
  bool requests_outstanding() const;
  const PeerStats& stats() const { return stats_; }

 private:
  enum class Accept { kCopied, kFetching, kRejected };
  // send side (channel_send.cpp)
  void decide_eager(SendOp& op);
  void issue_chunk(const std::shared_ptr<SendOp>& op, uint64_t off, uint64_t len, int active_lanes);
  void chunk_sent(const std::shared_ptr<SendOp>& op, const std::string& error, uint64_t length, int lane);
  void maybe_finish_send(SendOp& op);
  void send_credit(uint64_t bytes);
  void on_credit(uint64_t bytes);
  // receive side (channel_recv.cpp)
  Accept accept_chunk(const std::shared_ptr<RecvOp>& op, const FrameHeader& h, const HeldData& data);
  void on_fetched(const std::shared_ptr<RecvOp>& op, const FrameHeader& h, const Link::Fetched& f);
  void chunk_done(const std::shared_ptr<RecvOp>& op, const FrameHeader& h);
  void maybe_finish_recv(const std::shared_ptr<RecvOp>& op);
  void fail_recv(const std::shared_ptr<RecvOp>& op, FailKind kind, const std::string& msg);
  void reject_frame(const std::string& why);
  void discard(const FrameHeader& h);
  // Closed by the peer and nothing deliverable left: fail quietly with the close message.
  void settle_closed();
  struct Unexpected;
  using HeldQueues = std::map<Key, std::deque<Unexpected>>;
  // Releases the frames held for one key (each counted as discarded, its eager bytes
  // credited back, when `discarded`); returns the next entry.
  HeldQueues::iterator drop_held(HeldQueues::iterator it, bool discarded);

  PeerInfo info_;
  const TransportConfig& cfg_;
  const TestHooks& hooks_;
  Link& link_;
  std::function<void()> publish_;

  bool failed_ = false;
  FailKind fail_kind_ = FailKind::kTransport;
  std::string failure_;
  bool failure_processed_ = false;
  bool closed_ = false;  // peer_closed(): delivering what arrived, then failed_ with failure_

  // send side
  std::deque<std::shared_ptr<SendOp>> sendq_;          // not fully issued yet
  std::map<uint64_t, std::shared_ptr<SendOp>> sends_;  // every send not completed, by id
  std::set<Key> active_sends_;
  int inflight_ = 0;  // chunks in flight
  size_t rr_ = 0;     // round-robin lane cursor
  Clock::time_point send_progress_{};
  Clock::time_point link_free_{};  // emulation: when the modelled link is free again

  // receive side
  std::map<Key, std::shared_ptr<RecvOp>> recvs_;               // posted, not completed
  std::vector<std::shared_ptr<RecvOp>> draining_;              // failed or cancelled, requests outstanding
  std::set<Key> completed_;                                    // replay detection
  std::set<Key> cancelled_;                                    // frames of these transfers are discarded
  std::map<std::pair<uint16_t, uint32_t>, uint64_t> expired_;  // (kind, min shard) -> rounds below are discarded
  bool is_expired(const Key& k) const;
  std::function<bool(const Key&)> recv_pending_;  // see set_recv_pending
  struct Unexpected {
    FrameHeader h;
    HeldData data;
  };
  HeldQueues unexpected_;
  size_t unexpected_count_ = 0;
  uint64_t unexpected_eager_bytes_ = 0;

  PeerStats stats_;
};

}  // namespace geoloco::transport

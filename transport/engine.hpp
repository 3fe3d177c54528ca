// EngineTransport: what every backend shares. The API side (any thread) checks a call,
// creates the operation and posts it to the backend's loop thread; the loop thread runs one
// Channel per peer (channel.hpp) over the backend's Links. Also here: cancellation routing
// (an OpHandle can cancel after its transport is gone), the published stats snapshot, and
// set_active_lanes. A backend supplies post() (run on its loop thread), connects its peers
// and calls open_channels() once, then run_protocol() on every pass of its loop.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "transport/channel.hpp"
#include "transport/transport.hpp"

namespace geoloco::transport {

class EngineTransport : public Transport {
 public:
  ~EngineTransport() override;

  const Identity& self() const override { return self_; }
  const std::vector<PeerInfo>& peers() const override { return peer_infos_; }
  SendHandle send(int peer, FrameKind kind, uint64_t round, uint32_t shard, Payload payload) override;
  SendHandle send_on_lane(int peer, int lane, FrameKind kind, uint64_t round, uint32_t shard, Payload payload) override;
  RecvHandle recv(int peer, FrameKind kind, uint64_t round, uint32_t shard, std::vector<uint8_t> buffer) override;
  using Transport::recv;
  void cancel(int peer, const std::string& reason) override;
  void expire(FrameKind kind, uint64_t before_round, uint32_t min_shard) override;
  int lanes() const override { return cfg_.lanes; }
  void set_active_lanes(int n) override;
  int active_lanes() const override { return active_lanes_.load(); }
  TransportStats stats() const override;
  uint64_t generation(int peer) const override;

 protected:
  EngineTransport(TransportConfig cfg, Identity self, TestHooks hooks);

  // Runs `fn` on the loop thread, in posting order.
  virtual void post(std::function<void()> fn) = 0;
  // A connect()'s peer list: no self, no duplicate, site names within bounds (ConfigError).
  void check_peer_list(const std::vector<PeerInfo>& peers) const;
  // First thing in a backend's destructor: operations cancelled from now on are no longer
  // posted to it (their handles complete when the backend fails them at shutdown).
  void detach_handles();

  // ---- loop thread ----
  // The peers are known: one channel each, over links[i] (owned by the backend). Once.
  void open_channels(std::vector<PeerInfo> peers, const std::vector<Link*>& links);
  // Peer `i` came back (a rejoin: a new process of that site/rank authenticated after its
  // channel failed or closed): a fresh channel over `link` takes the old one's place, so the
  // API's later operations with the peer use it. The old channel (failed, its operations
  // completed) is kept until no binding request can still reach it. Counts generation(i).
  void reopen_channel(int i, Link& link);
  // The API may now post operations (connect() succeeded).
  void open_api();
  size_t channel_count() const { return channels_.size(); }
  Channel& channel(int i) { return *channels_.at(static_cast<size_t>(i)); }
  // One pass: the teardown of failed channels, sends within their windows, deadlines.
  // Returns whether anything happened; books the earliest timer in `next`.
  bool run_protocol(Clock::time_point now, Clock::time_point& next);
  bool has_active_ops() const;
  bool requests_outstanding() const;
  // Breaks every channel (shutdown, failed connect) and tears them down.
  void fail_all(FailKind kind, const std::string& msg, bool quiet);
  void abandon_requests();
  void publish_stats();
  // Counters that belong to the backend's connection handling.
  void count_refused_handshake();
  void count_unauthenticated_frame(const std::string& why);
  void set_gate_refused(uint64_t n);

  const TransportConfig cfg_;
  const Identity self_;
  const TestHooks hooks_;

 private:
  struct Canceller;
  void check_api(int peer, uint16_t kind, detail::OpState& st) const;
  void watch_cancel(const std::shared_ptr<detail::OpState>& st, int peer, uint64_t id);
  void publish_stats_throttled(Clock::time_point now);

  // Receives posted by callers and not yet run on the loop thread, by (peer, key): a frame of
  // a cancelled key that arrives meanwhile is held for the new receive (Channel::set_recv_pending).
  std::mutex pending_mu_;
  std::map<std::pair<int, Key>, int> pending_recvs_;
  std::atomic<int> active_lanes_;
  std::atomic<uint64_t> next_op_id_{1};
  std::atomic<bool> api_open_{false};
  std::vector<PeerInfo> peer_infos_;  // written once on the loop thread before api_open_
  std::shared_ptr<Canceller> canceller_;

  mutable std::mutex stats_mu_;
  TransportStats stats_;
  Clock::time_point last_stats_{};

  // Connections per peer so far (1 once connected; +1 per rejoin), for generation().
  mutable std::mutex gen_mu_;
  std::vector<uint64_t> generations_;

  // loop thread
  std::vector<std::unique_ptr<Channel>> channels_;
  std::vector<std::unique_ptr<Channel>> retired_;  // replaced by reopen_channel, still draining
};

}  // namespace geoloco::transport

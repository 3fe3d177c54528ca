// EngineTransport: the API side and the loop-side bookkeeping every backend shares (engine.hpp).
#include "transport/engine.hpp"

#include <fmt/format.h>

#include <set>

#include "core/log.hpp"
#include "transport/handshake.hpp"

namespace geoloco::transport {

std::string PeerInfo::name() const { return fmt::format("{}/{} ({}:{})", site, rank, host, port); }

int Transport::peer_index(const std::string& site, int rank) const {
  const auto& p = peers();
  for (size_t i = 0; i < p.size(); ++i)
    if (p[i].site == site && p[i].rank == rank) return static_cast<int>(i);
  return -1;
}

// What a handle's cancel() reaches: the transport while it lives, nothing afterwards.
struct EngineTransport::Canceller {
  std::mutex mu;
  EngineTransport* owner = nullptr;
};

EngineTransport::EngineTransport(TransportConfig cfg, Identity self, TestHooks hooks)
    : cfg_(std::move(cfg)), self_(std::move(self)), hooks_(std::move(hooks)), active_lanes_(cfg_.lanes) {
  cfg_.validate();
  if (self_.site.empty() || self_.site.size() > kMaxSiteBytes)
    throw ConfigError(fmt::format("transport: site name '{}' must have 1..{} bytes", self_.site, kMaxSiteBytes));
  if (self_.run_id.size() > kMaxRunIdBytes)
    throw ConfigError(fmt::format("transport: run id longer than {} bytes", kMaxRunIdBytes));
  canceller_ = std::make_shared<Canceller>();
  canceller_->owner = this;
}

EngineTransport::~EngineTransport() { detach_handles(); }

void EngineTransport::check_peer_list(const std::vector<PeerInfo>& peers) const {
  std::set<std::pair<std::string, int>> seen;
  for (const auto& p : peers) {
    if (p.site == self_.site && p.rank == self_.rank)
      throw ConfigError(fmt::format("transport: peer list contains ourselves ({})", p.name()));
    if (!seen.insert({p.site, p.rank}).second) throw ConfigError(fmt::format("transport: duplicate peer {}", p.name()));
    if (p.site.empty() || p.site.size() > kMaxSiteBytes)
      throw ConfigError(fmt::format("transport: peer site name '{}' must have 1..{} bytes", p.site, kMaxSiteBytes));
  }
}

void EngineTransport::detach_handles() {
  std::lock_guard<std::mutex> lock(canceller_->mu);
  canceller_->owner = nullptr;
}

void EngineTransport::check_api(int peer, uint16_t kind, detail::OpState& st) const {
  if (!api_open_.load(std::memory_order_acquire))
    st.finish(FailKind::kTransport, "transport: send/recv before connect() succeeded", 0);
  else if (peer < 0 || static_cast<size_t>(peer) >= peer_infos_.size())
    st.finish(FailKind::kTransport, fmt::format("transport: no peer with index {}", peer), 0);
  else if (!is_valid_kind(kind) || kind == static_cast<uint16_t>(FrameKind::kCredit))
    st.finish(FailKind::kTransport, fmt::format("transport: invalid frame kind {}", kind), 0);
}

void EngineTransport::watch_cancel(const std::shared_ptr<detail::OpState>& st, int peer, uint64_t id) {
  std::weak_ptr<Canceller> w = canceller_;
  st->set_canceller([w, peer, id] {
    auto c = w.lock();
    if (!c) return;
    std::lock_guard<std::mutex> lock(c->mu);
    if (c->owner == nullptr) return;
    EngineTransport* t = c->owner;
    t->post([t, peer, id] { t->channel(peer).cancel(id, "by the caller"); });
  });
}

SendHandle EngineTransport::send(int peer, FrameKind kind, uint64_t round, uint32_t shard, Payload payload) {
  return send_on_lane(peer, -1, kind, round, shard, std::move(payload));
}

SendHandle EngineTransport::send_on_lane(int peer, int lane, FrameKind kind, uint64_t round, uint32_t shard,
                                         Payload payload) {
  auto op = std::make_shared<SendOp>();
  op->id = next_op_id_++;
  op->key = Key{static_cast<uint16_t>(kind), round, shard};
  op->payload = payload ? std::move(payload) : make_payload({});
  op->lane = lane;
  op->state = std::make_shared<detail::OpState>();
  SendHandle h(op->state);
  check_api(peer, static_cast<uint16_t>(kind), *op->state);
  if (!h.ready() && lane != -1 && (lane < 0 || lane >= cfg_.lanes))
    op->state->finish(FailKind::kTransport, fmt::format("transport: no lane {} (lanes {})", lane, cfg_.lanes), 0);
  if (h.ready()) return h;
  watch_cancel(op->state, peer, op->id);
  post([this, peer, op] { channel(peer).post_send(op); });
  return h;
}

RecvHandle EngineTransport::recv(int peer, FrameKind kind, uint64_t round, uint32_t shard,
                                 std::vector<uint8_t> buffer) {
  auto op = std::make_shared<RecvOp>();
  op->id = next_op_id_++;
  op->key = Key{static_cast<uint16_t>(kind), round, shard};
  op->dest = std::make_shared<std::vector<uint8_t>>(std::move(buffer));
  op->state = std::make_shared<detail::OpState>();
  RecvHandle h(op->state);
  check_api(peer, static_cast<uint16_t>(kind), *op->state);
  if (h.ready()) return h;
  watch_cancel(op->state, peer, op->id);
  {
    std::lock_guard<std::mutex> lock(pending_mu_);
    ++pending_recvs_[{peer, op->key}];
  }
  post([this, peer, op] {
    {
      std::lock_guard<std::mutex> lock(pending_mu_);
      auto it = pending_recvs_.find({peer, op->key});
      if (it != pending_recvs_.end() && --it->second == 0) pending_recvs_.erase(it);
    }
    channel(peer).post_recv(op);
  });
  return h;
}

void EngineTransport::cancel(int peer, const std::string& reason) {
  if (!api_open_.load(std::memory_order_acquire) || peer < 0 || static_cast<size_t>(peer) >= peer_infos_.size())
    throw TransportError(fmt::format("transport: cancel: no peer with index {}", peer));
  post([this, peer, reason] { channel(peer).cancel_all(reason); });
}

void EngineTransport::expire(FrameKind kind, uint64_t before_round, uint32_t min_shard) {
  if (!api_open_.load(std::memory_order_acquire)) return;
  post([this, kind, before_round, min_shard] {
    for (auto& c : channels_) c->expire(static_cast<uint16_t>(kind), before_round, min_shard);
  });
}

void EngineTransport::set_active_lanes(int n) {
  if (n < 1 || n > cfg_.lanes)
    throw TransportError(fmt::format("transport: {} active lanes requested, expected 1..{}", n, cfg_.lanes));
  active_lanes_.store(n);
}

TransportStats EngineTransport::stats() const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  return stats_;
}

void EngineTransport::open_channels(std::vector<PeerInfo> peers, const std::vector<Link*>& links) {
  GEOLOCO_CHECK(channels_.empty() && peers.size() == links.size(), "channels opened twice or without links");
  peer_infos_ = std::move(peers);
  for (size_t i = 0; i < peer_infos_.size(); ++i)
    channels_.push_back(
        std::make_unique<Channel>(peer_infos_[i], cfg_, hooks_, *links[i], [this] { publish_stats(); }));
  for (size_t i = 0; i < channels_.size(); ++i)
    channels_[i]->set_recv_pending([this, peer = static_cast<int>(i)](const Key& k) {
      std::lock_guard<std::mutex> lock(pending_mu_);
      return pending_recvs_.count({peer, k}) > 0;
    });
  {
    std::lock_guard<std::mutex> lock(gen_mu_);
    generations_.assign(channels_.size(), 0);
  }
  publish_stats();
}

void EngineTransport::reopen_channel(int i, Link& link) {
  auto& slot = channels_.at(static_cast<size_t>(i));
  GEOLOCO_CHECK(slot->failed(), "reopen_channel: peer {} has not failed", i);
  slot->process_failure();
  retired_.push_back(std::move(slot));
  slot =
      std::make_unique<Channel>(peer_infos_[static_cast<size_t>(i)], cfg_, hooks_, link, [this] { publish_stats(); });
  slot->set_recv_pending([this, i](const Key& k) {
    std::lock_guard<std::mutex> lock(pending_mu_);
    return pending_recvs_.count({i, k}) > 0;
  });
  {
    std::lock_guard<std::mutex> lock(gen_mu_);
    ++generations_.at(static_cast<size_t>(i));
  }
  publish_stats();
}

uint64_t EngineTransport::generation(int peer) const {
  std::lock_guard<std::mutex> lock(gen_mu_);
  if (peer < 0 || static_cast<size_t>(peer) >= generations_.size()) return 0;
  return generations_[static_cast<size_t>(peer)];
}

void EngineTransport::open_api() {
  {
    std::lock_guard<std::mutex> lock(gen_mu_);
    for (auto& g : generations_) g = std::max<uint64_t>(g, 1);
  }
  api_open_.store(true, std::memory_order_release);
}

bool EngineTransport::run_protocol(Clock::time_point now, Clock::time_point& next) {
  bool busy = false, failures = false;
  for (auto& c : channels_) failures |= c->process_failure();
  const int lanes = active_lanes_.load();
  for (auto& c : channels_) busy |= c->pump(lanes, now, next);
  for (auto& c : channels_) c->check_timers(now, next);
  // A deadline may have failed a channel: tear it down in this pass.
  for (auto& c : channels_) failures |= c->process_failure();
  // Replaced channels: torn down already; dropped once no binding request can reach them.
  for (auto& c : retired_) c->process_failure();
  std::erase_if(retired_, [](const std::unique_ptr<Channel>& c) { return !c->requests_outstanding(); });
  if (failures) {
    publish_stats();
  } else {
    publish_stats_throttled(now);
  }
  return busy || failures;
}

bool EngineTransport::has_active_ops() const {
  for (const auto& c : channels_)
    if (c->active()) return true;
  return false;
}

bool EngineTransport::requests_outstanding() const {
  for (const auto& c : channels_)
    if (c->requests_outstanding()) return true;
  for (const auto& c : retired_)
    if (c->requests_outstanding()) return true;
  return false;
}

void EngineTransport::fail_all(FailKind kind, const std::string& msg, bool quiet) {
  for (auto& c : channels_) c->fail(kind, msg, quiet);
  for (auto& c : channels_) c->process_failure();
  publish_stats();
}

void EngineTransport::abandon_requests() {
  for (auto& c : channels_) c->abandon_requests();
  for (auto& c : retired_) c->abandon_requests();
}

void EngineTransport::publish_stats() {
  std::lock_guard<std::mutex> lock(stats_mu_);
  stats_.peers.clear();
  for (auto& c : channels_) stats_.peers.push_back(c->stats());
}

void EngineTransport::publish_stats_throttled(Clock::time_point now) {
  if (now - last_stats_ < std::chrono::milliseconds(20)) return;
  last_stats_ = now;
  publish_stats();
}

void EngineTransport::count_refused_handshake() {
  std::lock_guard<std::mutex> lock(stats_mu_);
  ++stats_.handshakes_refused;
}

void EngineTransport::count_unauthenticated_frame(const std::string& why) {
  std::lock_guard<std::mutex> lock(stats_mu_);
  if (stats_.frames_rejected_unauthenticated++ < 10) spdlog::warn("transport: dropped frame: {}", why);
}

void EngineTransport::set_gate_refused(uint64_t n) {
  std::lock_guard<std::mutex> lock(stats_mu_);
  stats_.gate_refused = n;
}

}  // namespace geoloco::transport

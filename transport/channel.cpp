// Channel: life cycle -- failure, cancellation, deadlines, shutdown (channel.hpp). The send
// and receive sides are in channel_send.cpp and channel_recv.cpp.
#include "transport/channel.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "core/log.hpp"

namespace geoloco::transport {

std::string key_str(const Key& k) {
  return fmt::format("{} round {} shard {}", to_string(static_cast<FrameKind>(std::get<0>(k))), std::get<1>(k),
                     std::get<2>(k));
}

Clock::duration seconds_d(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

Channel::Channel(PeerInfo info, const TransportConfig& cfg, const TestHooks& hooks, Link& link,
                 std::function<void()> publish)
    : info_(std::move(info)), cfg_(cfg), hooks_(hooks), link_(link), publish_(std::move(publish)) {
  stats_.site = info_.site;
  stats_.rank = info_.rank;
  stats_.lane_bytes_sent.assign(static_cast<size_t>(cfg_.lanes), 0);
}

bool Channel::requests_outstanding() const {
  if (inflight_ > 0) return true;
  for (const auto& op : draining_)
    if (op->inflight > 0) return true;
  for (const auto& [k, op] : recvs_)
    if (op->inflight > 0) return true;
  return false;
}

void Channel::cancel(uint64_t id, const std::string& reason) {
  const std::string msg = fmt::format("cancelled: {} (peer {})", reason, info_.name());
  if (auto it = sends_.find(id); it != sends_.end()) {
    auto op = it->second;
    if (op->fail != FailKind::kNone) return;
    op->fail = FailKind::kCancelled;
    op->fail_msg = fmt::format("send {}: {}", key_str(op->key), msg);
    // Chunks not yet issued never go out; issued ones complete first.
    std::erase(sendq_, op);
    maybe_finish_send(*op);
    return;
  }
  for (auto& [k, op] : recvs_)
    if (op->id == id) {
      auto keep = op;  // fail_recv erases it from recvs_
      fail_recv(keep, FailKind::kCancelled, fmt::format("recv {}: {}", key_str(keep->key), msg));
      return;
    }
}

void Channel::cancel_all(const std::string& reason) {
  std::vector<uint64_t> ids;
  for (const auto& [id, op] : sends_) ids.push_back(id);
  for (const auto& [k, op] : recvs_) ids.push_back(op->id);
  for (uint64_t id : ids) cancel(id, reason);
}

void Channel::fail(FailKind kind, const std::string& msg, bool quiet) {
  if (failed_) return;
  failed_ = true;
  fail_kind_ = kind;
  failure_ = msg;
  stats_.failure = msg;
  if (!quiet) spdlog::error("transport: {}", msg);
  publish_();  // whoever sees an operation fail also sees why in the stats
  std::vector<std::shared_ptr<RecvOp>> recvs;
  for (auto& [k, op] : recvs_) recvs.push_back(op);
  for (auto& op : recvs) fail_recv(op, kind, msg);
  for (auto& [id, op] : sends_)
    if (op->fail == FailKind::kNone) {
      op->fail = kind;
      op->fail_msg = msg;
    }
}

void Channel::peer_closed(const std::string& msg) {
  if (failed_ || closed_) return;
  closed_ = true;
  failure_ = msg;  // what later receives fail with
  fail_kind_ = FailKind::kTransport;
  stats_.failure = msg;
  publish_();  // whoever sees an operation fail also sees why in the stats
  // Held messages the peer finished stay for their receives; a partial one never completes,
  // nor does one whose data would still have to be fetched from the peer.
  for (auto it = unexpected_.begin(); it != unexpected_.end();) {
    const auto& q = it->second;
    const bool whole = q.size() == chunk_count(q.front().h.total_length, cfg_.chunk_bytes) &&
                       std::none_of(q.begin(), q.end(), [](const Unexpected& e) { return e.data.needs_fetch; });
    it = whole ? std::next(it) : drop_held(it, /*discarded=*/false);
  }
  std::vector<std::shared_ptr<RecvOp>> partial;
  for (auto& [k, op] : recvs_)
    if (!op->have_total || op->got != op->nchunks) partial.push_back(op);
  for (auto& op : partial) fail_recv(op, FailKind::kTransport, msg);
  // Nothing sent to it will be received.
  sendq_.clear();
  for (auto& [id, op] : std::map<uint64_t, std::shared_ptr<SendOp>>(sends_)) {
    if (op->fail == FailKind::kNone) op->fail = FailKind::kTransport, op->fail_msg = msg;
    maybe_finish_send(*op);
  }
  settle_closed();
}

void Channel::settle_closed() {
  if (!closed_ || failed_ || !recvs_.empty() || !unexpected_.empty()) return;
  const std::string msg = failure_;
  fail(FailKind::kTransport, msg, /*quiet=*/true);
}

bool Channel::process_failure() {
  if (!failed_ || failure_processed_) return false;
  failure_processed_ = true;
  link_.abort();
  for (auto& [k, q] : unexpected_)
    for (auto& e : q) link_.release(e.data);
  unexpected_.clear();
  unexpected_count_ = 0;
  unexpected_eager_bytes_ = 0;
  // Sends not yet issued finish now; issued ones when the binding returns their requests.
  sendq_.clear();
  std::vector<std::shared_ptr<SendOp>> sends;
  for (auto& [id, op] : sends_) sends.push_back(op);
  for (auto& op : sends) maybe_finish_send(*op);
  auto draining = draining_;
  for (auto& op : draining) maybe_finish_recv(op);
  return true;
}

void Channel::check_timers(Clock::time_point now, Clock::time_point& next) {
  auto book = [&](Clock::time_point t) {
    if (next == Clock::time_point{} || t < next) next = t;
  };
  // Operations whose failure waits on the binding to give back their requests.
  for (auto& op : std::vector<std::shared_ptr<RecvOp>>(draining_)) {
    if (op->inflight == 0) continue;
    if (now - op->failed_at > seconds_d(kCancelGraceS)) {
      spdlog::error(
          "transport: {} request(s) of {} from {} were not returned within {} s; failing the handle "
          "anyway (its buffer stays with the request)",
          op->inflight, key_str(op->key), info_.name(), kCancelGraceS);
      op->state->finish(op->fail, op->fail_msg, 0);  // without the buffer: a request may still write it
      std::erase(draining_, op);
    } else {
      book(op->failed_at + seconds_d(kCancelGraceS));
    }
  }
  if (failed_) return;
  const auto timeout = seconds_d(cfg_.transfer_timeout_s);
  if (!sendq_.empty() || inflight_ > 0) {
    if (now - send_progress_ > timeout)
      return fail(FailKind::kTimeout,
                  fmt::format("send to peer {} made no progress for {} s", info_.name(), cfg_.transfer_timeout_s));
    book(send_progress_ + timeout);
  }
  for (auto& [k, op] : recvs_) {
    if (now - op->last_progress > timeout)
      return fail(FailKind::kTimeout, fmt::format("recv {} from peer {} timed out: no data for {} s ({} of {} chunks)",
                                                  key_str(k), info_.name(), cfg_.transfer_timeout_s, op->verified,
                                                  op->have_total ? std::to_string(op->nchunks) : std::string("?")));
    book(op->last_progress + timeout);
  }
}

void Channel::abandon_requests() {
  for (auto& [id, op] : std::map<uint64_t, std::shared_ptr<SendOp>>(sends_)) {
    if (op->fail == FailKind::kNone) op->fail = fail_kind_, op->fail_msg = failure_;
    inflight_ -= op->inflight;
    op->inflight = 0;
    maybe_finish_send(*op);
  }
  for (auto& op : std::vector<std::shared_ptr<RecvOp>>(draining_)) {
    // The binding is gone: no request can write any more, but keep the contract simple.
    op->state->finish(op->fail, op->fail_msg, 0);
  }
  draining_.clear();
}

}  // namespace geoloco::transport

// Channel, send side: the queue, chunking over lanes within the pipelining window, the
// sender-side link emulator, the eager window and its credits (channel.hpp).
#include <fmt/format.h>

#include <algorithm>
#include <array>

#include "transport/channel.hpp"

namespace geoloco::transport {

void Channel::post_send(std::shared_ptr<SendOp> op) {
  if (failed_ || closed_) return op->state->finish(fail_kind_, failure_, 0);
  if (active_sends_.count(op->key))
    return op->state->finish(FailKind::kTransport,
                             fmt::format("send {} to peer {}: already in progress", key_str(op->key), info_.name()), 0);
  op->nchunks = chunk_count(op->payload->size(), cfg_.chunk_bytes);
  op->enqueued = Clock::now();
  if (sendq_.empty()) send_progress_ = op->enqueued;
  active_sends_.insert(op->key);
  sends_[op->id] = op;
  sendq_.push_back(std::move(op));
}

// A message of at most eager_bytes goes eagerly when the peer's eager window has room: no
// rendezvous handshake (request to send, ready to receive, data, acknowledgement: about two
// round trips over TCP where eager takes half of one), so it arrives half a round trip
// after it leaves. The window (kEagerWindowFactor x eager_bytes per peer) bounds what a
// receiver may have to park for us before it posts the receive: it returns the bytes in a
// credit frame once the message is received. A full window, or a longer message, is left
// to the binding (UCX: rendezvous above its threshold), which moves data only once the
// receiver is ready, so a sender far ahead slows to the rendezvous instead of flooding the
// peer. (An eager prefix of a long message measured worse than none: the tail's rendezvous
// requests queue behind it on the connection.)
void Channel::decide_eager(SendOp& op) {
  const uint64_t n = op.payload->size();
  const uint64_t window = kEagerWindowFactor * cfg_.eager_bytes;
  uint64_t& outstanding = stats_.eager_bytes_outstanding;  // not yet credited back
  op.eager = n > 0 && n <= cfg_.eager_bytes && outstanding + n <= window;
  if (!op.eager) return;
  outstanding += n;
  ++stats_.messages_sent_eager;
}

// Returns `bytes` of the peer's eager window: a header-only frame on its first lane that is up.
void Channel::send_credit(uint64_t bytes) {
  if (failed_ || closed_ || bytes == 0) return;
  int lane = -1;
  for (int l = 0; l < cfg_.lanes && lane < 0; ++l)
    if (link_.lane_up(l)) lane = l;
  if (lane < 0) return;  // the connection is going away; so is the window
  FrameHeader h;
  h.kind = static_cast<uint16_t>(FrameKind::kCredit);
  h.round = bytes;
  h.checksum = chunk_checksum({});
  auto hdr = std::make_shared<std::array<uint8_t, kFrameHeaderBytes>>();
  h.encode(hdr->data());
  // An error here means the connection is failing: the binding reports that on its own.
  link_.send_frame(lane, *hdr, {}, /*eager=*/true, [hdr](const std::string&) {});
}

void Channel::on_credit(uint64_t bytes) {
  uint64_t& outstanding = stats_.eager_bytes_outstanding;
  if (bytes > outstanding)
    return reject_frame(
        fmt::format("credit frame returns {} eager bytes, only {} are outstanding", bytes, outstanding));
  outstanding -= bytes;
}

bool Channel::pump(int active_lanes, Clock::time_point now, Clock::time_point& next) {
  bool any = false;
  while (!failed_ && !closed_ && !sendq_.empty() && inflight_ < cfg_.inflight_chunks) {
    auto op = sendq_.front();
    if (op->next_chunk == op->nchunks) {
      sendq_.pop_front();  // fully issued; completes in the continuations
      continue;
    }
    const uint64_t size = op->payload->size();
    const uint64_t off = op->next_chunk * cfg_.chunk_bytes;
    const uint64_t len = std::min<uint64_t>(cfg_.chunk_bytes, size - std::min<uint64_t>(off, size));
    if (cfg_.emulate.enabled()) {
      if (!op->next_release) {
        // Sender-side link model: chunks serialize at rate_mbit from when the data was
        // handed to us, then arrive delay_ms later.
        auto start = std::max(op->enqueued, link_free_);
        if (cfg_.emulate.rate_mbit > 0)
          start += seconds_d(static_cast<double>(len) * 8.0 / (cfg_.emulate.rate_mbit * 1e6));
        link_free_ = start;
        op->next_release = start + seconds_d(cfg_.emulate.delay_ms / 1000.0);
      }
      if (*op->next_release > now) {
        send_progress_ = now;  // held back by the emulated link, not stalled
        if (next == Clock::time_point{} || *op->next_release < next) next = *op->next_release;
        break;
      }
      op->next_release.reset();
    }
    if (op->next_chunk == 0) decide_eager(*op);
    issue_chunk(op, off, len, active_lanes);
    ++op->next_chunk;
    any = true;
  }
  return any;
}

namespace {
// One chunk on the wire. With the tamper hook a chunk may become several frames (or none);
// it completes when its last frame does.
struct ChunkFrames {
  std::array<uint8_t, kFrameHeaderBytes> header{};
  std::vector<TamperedFrame> tampered;
  int left = 0;
  std::string error;
  uint64_t length = 0;
  int lane = -1;
};
}  // namespace

void Channel::issue_chunk(const std::shared_ptr<SendOp>& op, uint64_t off, uint64_t len, int active_lanes) {
  FrameHeader h;
  h.kind = std::get<0>(op->key);
  h.round = std::get<1>(op->key);
  h.shard = std::get<2>(op->key);
  h.offset = off;
  h.length = len;
  h.total_length = op->payload->size();
  const auto chunk = std::span<const uint8_t>(op->payload->data() + off, len);
  h.checksum = chunk_checksum(chunk);
  if (op->eager) h.flags |= kFrameFlagEagerCredit;
  auto c = std::make_shared<ChunkFrames>();
  c->length = len;
  if (hooks_.tamper) {
    c->tampered = hooks_.tamper(h, chunk);
  } else {
    h.encode(c->header.data());
  }
  const int parts = hooks_.tamper ? static_cast<int>(c->tampered.size()) : 1;
  ++op->inflight;
  ++inflight_;
  if (parts == 0) return chunk_sent(op, "", 0, -1);  // the hook dropped the chunk
  c->left = parts;
  auto part_done = [this, op, c](const std::string& error) {
    if (!error.empty()) c->error = error;
    if (--c->left == 0) chunk_sent(op, c->error, c->length, c->lane);
  };
  for (int i = 0; i < parts; ++i) {
    std::span<const uint8_t> hdr = c->header, payload = chunk;
    if (hooks_.tamper)
      hdr = c->tampered[static_cast<size_t>(i)].header, payload = c->tampered[static_cast<size_t>(i)].payload;
    const int active = std::clamp(active_lanes, 1, cfg_.lanes);
    const int lane = op->lane >= 0 ? op->lane : static_cast<int>(rr_++ % static_cast<size_t>(active));
    c->lane = lane;
    if (!link_.lane_up(lane)) {
      part_done(fmt::format("lane {} is not connected", lane));
      continue;
    }
    // decide_eager() says why and when a message goes eagerly.
    if (auto now = link_.send_frame(lane, hdr, payload, op->eager, part_done)) part_done(*now);
  }
}

void Channel::chunk_sent(const std::shared_ptr<SendOp>& op, const std::string& error, uint64_t length, int lane) {
  --op->inflight;
  --inflight_;
  if (!error.empty()) {
    fail(FailKind::kTransport, fmt::format("sending {} to peer {} failed: {}", key_str(op->key), info_.name(), error));
  } else {
    ++op->done_chunks;
    stats_.bytes_sent += length;
    if (lane >= 0 && static_cast<size_t>(lane) < stats_.lane_bytes_sent.size())
      stats_.lane_bytes_sent[static_cast<size_t>(lane)] += length;
    ++stats_.frames_sent;
    send_progress_ = Clock::now();
  }
  maybe_finish_send(*op);
}

void Channel::maybe_finish_send(SendOp& op) {
  if (op.inflight > 0) return;
  if (op.fail == FailKind::kNone && failed_) op.fail = fail_kind_, op.fail_msg = failure_;
  if (op.fail != FailKind::kNone) {
    if (op.fail == FailKind::kCancelled) ++stats_.ops_cancelled;
    op.state->finish(op.fail, op.fail_msg, 0);
  } else if (op.done_chunks == op.nchunks) {
    publish_();
    op.state->finish_ok(op.payload->size());
  } else {
    return;
  }
  active_sends_.erase(op.key);
  sends_.erase(op.id);
}

}  // namespace geoloco::transport

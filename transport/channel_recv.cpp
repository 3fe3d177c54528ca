// Channel, receive side: frame checks, reassembly into the posted receive, frames held until
// their receive is posted, checksums, replays, discarding what the caller cancelled
// (channel.hpp; the checks and their order: README.md, "Frames").
#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "core/hash.hpp"
#include "transport/channel.hpp"

namespace geoloco::transport {

void Channel::reject_frame(const std::string& why) {
  ++stats_.frames_rejected;
  fail(FailKind::kFrame, fmt::format("frame from peer {} rejected: {}", info_.name(), why));
}

// A frame of a transfer the caller cancelled: dropped, its eager bytes returned at once
// (nobody will park them).
void Channel::discard(const FrameHeader& h) {
  ++stats_.frames_discarded;
  if (h.flags & kFrameFlagEagerCredit) send_credit(h.length);
}

Disposition Channel::on_frame(std::span<const uint8_t> header, const HeldData& data) {
  if (failed_ || closed_) return Disposition::kRelease;  // closed: the peer said it sent nothing more
  auto hdr = FrameHeader::decode(header);
  if (!hdr) {
    reject_frame(fmt::format("header: {} bytes, expected {}", header.size(), kFrameHeaderBytes));
    return Disposition::kRelease;
  }
  const FrameHeader& h = *hdr;
  const Key key{h.kind, h.round, h.shard};
  if (std::string e = validate_header(h, data.length, cfg_.chunk_bytes, cfg_.max_message_bytes); !e.empty()) {
    reject_frame(fmt::format("{} ({}, offset {})", e, key_str(key), h.offset));
    return Disposition::kRelease;
  }
  if (h.kind == static_cast<uint16_t>(FrameKind::kCredit)) {
    on_credit(h.round);
    return Disposition::kRelease;
  }
  if (completed_.count(key)) {
    reject_frame(fmt::format("replayed frame: {} already completed (offset {})", key_str(key), h.offset));
    return Disposition::kRelease;
  }
  // A cancelled transfer's frames are dropped, unless the caller has asked for the key again
  // and that receive is on its way to this thread: then the frame is the new transfer's.
  if ((cancelled_.count(key) || is_expired(key)) && !(recv_pending_ && recv_pending_(key)) && !recvs_.count(key)) {
    discard(h);
    return Disposition::kRelease;
  }
  if (auto r = recvs_.find(key); r != recvs_.end()) {
    auto op = r->second;  // keep alive: accept_chunk may complete and erase it
    accept_chunk(op, h, data);
    return Disposition::kRelease;  // copied, handed to a fetch (which holds what it needs), or refused
  }
  if (!data.needs_fetch && unexpected_eager_bytes_ + data.length > kMaxUnexpectedEagerBytes) {
    reject_frame(fmt::format("more than {} bytes of eager frames arrived before their recv was posted ({})",
                             kMaxUnexpectedEagerBytes, key_str(key)));
    return Disposition::kRelease;
  }
  if (unexpected_count_ >= kMaxUnexpectedFrames) {
    reject_frame(fmt::format("more than {} frames arrived before their recv was posted ({})", kMaxUnexpectedFrames,
                             key_str(key)));
    return Disposition::kRelease;
  }
  // Not posted yet: keep the binding's descriptor (no copy, no allocation sized by the peer).
  if (data.length > 0 && !data.keepable) {
    reject_frame("internal: eager data the binding cannot keep");
    return Disposition::kRelease;
  }
  unexpected_[key].push_back(Unexpected{h, data});
  ++unexpected_count_;
  if (!data.needs_fetch) unexpected_eager_bytes_ += data.length;
  return data.token != nullptr ? Disposition::kKept : Disposition::kRelease;
}

bool Channel::is_expired(const Key& k) const {
  for (const auto& [ks, before] : expired_)
    if (std::get<0>(k) == ks.first && std::get<2>(k) >= ks.second && std::get<1>(k) < before) return true;
  return false;
}

void Channel::expire(uint16_t kind, uint64_t before, uint32_t min_shard) {
  uint64_t& b = expired_[{kind, min_shard}];
  b = std::max(b, before);
  for (auto it = unexpected_.begin(); it != unexpected_.end();)
    it = is_expired(it->first) ? drop_held(it, /*discarded=*/true) : std::next(it);
}

Channel::HeldQueues::iterator Channel::drop_held(HeldQueues::iterator it, bool discarded) {
  for (auto& e : it->second) {
    if (!e.data.needs_fetch) unexpected_eager_bytes_ -= e.data.length;
    if (discarded) discard(e.h);
    link_.release(e.data);
  }
  unexpected_count_ -= it->second.size();
  return unexpected_.erase(it);
}

void Channel::post_recv(std::shared_ptr<RecvOp> op) {
  if (failed_) return op->state->finish(fail_kind_, failure_, 0);
  if (closed_ && !unexpected_.count(op->key)) return op->state->finish(fail_kind_, failure_, 0);
  if (recvs_.count(op->key) || completed_.count(op->key))
    return op->state->finish(
        FailKind::kTransport,
        fmt::format("recv {} from peer {}: already posted or completed", key_str(op->key), info_.name()), 0);
  cancelled_.erase(op->key);  // posted again after a cancel: its frames are wanted again
  op->last_progress = Clock::now();
  recvs_[op->key] = op;
  auto u = unexpected_.find(op->key);
  if (u == unexpected_.end()) return;
  std::deque<Unexpected> held = std::move(u->second);
  unexpected_.erase(u);
  unexpected_count_ -= held.size();
  for (const auto& e : held)
    if (!e.data.needs_fetch) unexpected_eager_bytes_ -= e.data.length;
  for (auto& e : held) {
    // Eager data was copied (or refused) and is freed now; a fetch holds what it needs.
    const Accept a = failed_ ? Accept::kRejected : accept_chunk(op, e.h, e.data);
    if (a != Accept::kFetching) link_.release(e.data);
  }
}

Channel::Accept Channel::accept_chunk(const std::shared_ptr<RecvOp>& op, const FrameHeader& h, const HeldData& data) {
  auto reject = [&](const std::string& why) {
    reject_frame(why);
    return Accept::kRejected;
  };
  if (op->fail != FailKind::kNone) return Accept::kRejected;
  if (h.total_length > op->dest->size())
    return reject(fmt::format("total_length: {} exceeds the receive buffer of {} bytes ({})", h.total_length,
                              op->dest->size(), key_str(op->key)));
  if (!op->have_total) {
    op->have_total = true;
    op->total = h.total_length;
    op->nchunks = chunk_count(op->total, cfg_.chunk_bytes);
    op->seen.assign(op->nchunks, false);  // bounded by dest size / chunk_bytes + 1
  } else if (h.total_length != op->total) {
    return reject(fmt::format("total_length: changed from {} to {} ({})", op->total, h.total_length, key_str(op->key)));
  }
  const uint64_t idx = h.offset / cfg_.chunk_bytes;
  if (op->seen[idx])
    return reject(fmt::format("offset: duplicate chunk at offset {} (replay) ({})", h.offset, key_str(op->key)));
  op->seen[idx] = true;
  ++op->got;
  if (h.flags & kFrameFlagEagerCredit) op->credit_bytes += h.length;
  op->last_progress = Clock::now();
  const std::span<uint8_t> dst(op->dest->data() + h.offset, h.length);
  if (data.needs_fetch) {
    ++stats_.frames_received_rndv;
    ++op->inflight;
    // The continuation holds the operation, hence its buffer, until the fetch returns.
    auto done = [this, op, h](const Link::Fetched& f) { on_fetched(op, h, f); };
    if (auto now = link_.fetch(data, dst, done)) on_fetched(op, h, *now);
    return Accept::kFetching;
  }
  if (h.length > 0) std::memcpy(dst.data(), data.bytes, h.length);
  chunk_done(op, h);
  return Accept::kCopied;
}

void Channel::on_fetched(const std::shared_ptr<RecvOp>& op, const FrameHeader& h, const Link::Fetched& f) {
  --op->inflight;
  if (!f.error.empty()) {
    fail(FailKind::kTransport,
         fmt::format("receiving {} from peer {} failed: {}", key_str(op->key), info_.name(), f.error));
    maybe_finish_recv(op);
  } else if (f.length != h.length) {
    reject_frame(fmt::format("length: received {} bytes, header said {}", f.length, h.length));
    maybe_finish_recv(op);
  } else {
    chunk_done(op, h);
  }
}

void Channel::chunk_done(const std::shared_ptr<RecvOp>& op, const FrameHeader& h) {
  if (op->fail == FailKind::kNone) {
    const uint64_t sum = chunk_checksum(std::span<const uint8_t>(op->dest->data() + h.offset, h.length));
    if (sum != h.checksum) {
      reject_frame(fmt::format("checksum: mismatch at offset {} length {} ({}): header {}, data {}", h.offset, h.length,
                               key_str(op->key), hex64(h.checksum), hex64(sum)));
    } else {
      ++op->verified;
      op->last_progress = Clock::now();
      stats_.bytes_received += h.length;
      ++stats_.frames_received;
    }
  }
  maybe_finish_recv(op);
}

// A failed or cancelled receive leaves the posted set at once (its later frames are then
// discarded or refused) and completes once no fetch can write into its buffer.
void Channel::fail_recv(const std::shared_ptr<RecvOp>& op, FailKind kind, const std::string& msg) {
  if (op->fail != FailKind::kNone) return;
  op->fail = kind;
  op->fail_msg = msg;
  op->failed_at = Clock::now();
  if (auto it = recvs_.find(op->key); it != recvs_.end() && it->second == op) recvs_.erase(it);
  if (kind == FailKind::kCancelled) {
    cancelled_.insert(op->key);
    // Its eager frames already accepted are ours to drop: return them to the sender's window.
    send_credit(op->credit_bytes);
    op->credit_bytes = 0;
  }
  draining_.push_back(op);
  maybe_finish_recv(op);
}

void Channel::maybe_finish_recv(const std::shared_ptr<RecvOp>& op) {
  if (op->inflight > 0) return;
  if (op->fail != FailKind::kNone) {
    if (op->fail == FailKind::kCancelled) ++stats_.ops_cancelled;
    op->state->finish(op->fail, op->fail_msg, 0);
    std::erase(draining_, op);
    return settle_closed();
  }
  if (!op->have_total || op->verified != op->nchunks) return;
  completed_.insert(op->key);
  recvs_.erase(op->key);
  send_credit(op->credit_bytes);  // the eager bytes are ours now, not parked
  op->credit_bytes = 0;
  publish_();
  op->state->finish_ok(op->total, std::move(op->dest));
  settle_closed();
}

}  // namespace geoloco::transport

// Operation state and handles: completion, typed errors, take(), cancel() (op.hpp).
#include "transport/op.hpp"

#include "core/error.hpp"
#include "transport/transport_error.hpp"

namespace geoloco::transport {

void throw_failure(FailKind kind, const std::string& message) {
  switch (kind) {
    case FailKind::kFrame: throw FrameError(message);
    case FailKind::kTimeout: throw TimeoutError(message);
    case FailKind::kHandshake: throw HandshakeError(message);
    case FailKind::kCancelled: throw CancelledError(message);
    case FailKind::kTransport:
    case FailKind::kNone: break;
  }
  throw TransportError(message);
}

namespace detail {

void OpState::finish(FailKind kind, std::string message, uint64_t bytes, std::shared_ptr<std::vector<uint8_t>> buffer) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return;
    done_ = true;
    kind_ = kind;
    message_ = std::move(message);
    bytes_ = bytes;
    buffer_ = std::move(buffer);
    canceller_ = nullptr;  // drops what it captured (a weak reference to the transport)
  }
  cv_.notify_all();
}

void OpState::set_canceller(std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!done_) canceller_ = std::move(fn);
}

void OpState::throw_error_locked() { throw_failure(kind_, message_); }

void OpState::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_; });
  if (kind_ != FailKind::kNone) throw_error_locked();
}

bool OpState::wait_for(std::chrono::duration<double> timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return done_; })) return false;
  if (kind_ != FailKind::kNone) throw_error_locked();
  return true;
}

bool OpState::ready() {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

uint64_t OpState::bytes() {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

std::vector<uint8_t> OpState::take() {
  std::shared_ptr<std::vector<uint8_t>> b;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!done_ || kind_ != FailKind::kNone) return {};
    b = std::move(buffer_);
  }
  if (!b) return {};
  // The loop thread dropped its reference when it completed the operation.
  return b.use_count() == 1 ? std::move(*b) : *b;
}

void OpState::cancel() {
  std::function<void()> fn;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return;
    fn = std::move(canceller_);
    canceller_ = nullptr;
  }
  if (fn) fn();  // outside the lock: it posts to the loop thread, which finishes us
}

FailKind OpState::error_kind() {
  std::lock_guard<std::mutex> lock(mu_);
  return done_ ? kind_ : FailKind::kNone;
}

}  // namespace detail

void OpHandle::wait() const {
  GEOLOCO_CHECK(s_ != nullptr, "wait() on an empty handle");
  s_->wait();
}

bool OpHandle::wait_for(std::chrono::duration<double> timeout) const {
  GEOLOCO_CHECK(s_ != nullptr, "wait_for() on an empty handle");
  return s_->wait_for(timeout);
}

bool OpHandle::ready() const { return s_ && s_->ready(); }

uint64_t OpHandle::bytes() const {
  GEOLOCO_CHECK(s_ != nullptr, "bytes() on an empty handle");
  return s_->bytes();
}

std::vector<uint8_t> OpHandle::take() const { return s_ ? s_->take() : std::vector<uint8_t>{}; }

void OpHandle::cancel() const {
  if (s_) s_->cancel();
}

FailKind OpHandle::error_kind() const { return s_ ? s_->error_kind() : FailKind::kNone; }

}  // namespace geoloco::transport

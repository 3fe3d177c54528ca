// Operations and their handles: what a send or a receive owns, how it completes, and how a
// caller waits for it or cancels it.
//
// An operation owns its buffer for its whole life: a send holds its payload (shared, so one
// payload can go to several peers), a receive holds the buffer it fills and hands it back
// with take() once it succeeded. So a caller may drop a handle, or the whole transport, at
// any time: nothing the transport may still write into or read from is ever released under
// it, and nothing is kept beyond the last request that can touch it.
//
// Completion is (done, error kind, message, bytes). The error is kept as (kind, text) and
// each waiter throws its own exception object: exception objects are never shared between
// threads (their reference count lives in uninstrumented libstdc++, which TSan cannot follow).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace geoloco::transport {

// Bytes a send owns for its whole life (shared: one payload may go to several peers).
using Payload = std::shared_ptr<const std::vector<uint8_t>>;
inline Payload make_payload(std::vector<uint8_t> bytes) {
  return std::make_shared<const std::vector<uint8_t>>(std::move(bytes));
}

// The type an operation failed with; each maps to one exception class (transport_error.hpp).
enum class FailKind { kNone, kTransport, kHandshake, kFrame, kTimeout, kCancelled };

// Throws the exception class of `kind` with `message` (kind must not be kNone).
[[noreturn]] void throw_failure(FailKind kind, const std::string& message);

namespace detail {

// Shared by the transport's loop thread and the handle's holders.
class OpState {
 public:
  // Completes the operation once; later calls are ignored. `buffer` (a receive's, on success
  // or after its last request returned) becomes what take() hands back.
  void finish(FailKind kind, std::string message, uint64_t bytes,
              std::shared_ptr<std::vector<uint8_t>> buffer = nullptr);
  void finish_ok(uint64_t bytes, std::shared_ptr<std::vector<uint8_t>> buffer = nullptr) {
    finish(FailKind::kNone, {}, bytes, std::move(buffer));
  }

  // Installed by the transport when the operation is registered: asks its loop thread to
  // cancel this operation. Called at most once, from any thread; may outlive the transport.
  void set_canceller(std::function<void()> fn);

  void wait();
  bool wait_for(std::chrono::duration<double> timeout);
  bool ready();
  uint64_t bytes();
  std::vector<uint8_t> take();
  void cancel();
  FailKind error_kind();

 private:
  [[noreturn]] void throw_error_locked();

  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  FailKind kind_ = FailKind::kNone;
  std::string message_;
  uint64_t bytes_ = 0;
  std::shared_ptr<std::vector<uint8_t>> buffer_;
  std::function<void()> canceller_;
};

}  // namespace detail

// Handle of one asynchronous send or receive. Copyable (shared state).
class OpHandle {
 public:
  OpHandle() = default;
  explicit OpHandle(std::shared_ptr<detail::OpState> s) : s_(std::move(s)) {}
  // Blocks until done; throws the operation's error (TransportError and its subclasses).
  void wait() const;
  // True when done (throws the error if it failed), false if `timeout` passed first.
  bool wait_for(std::chrono::duration<double> timeout) const;
  // Done (successfully or not); never throws.
  bool ready() const;
  // Payload bytes of the transfer (for a receive: the total the sender announced). Valid when done.
  uint64_t bytes() const;
  // A receive that succeeded: the buffer given to recv(), at its original size, of which the
  // first bytes() arrived. Empty for a send, before completion, after a failure whose requests
  // could not all be returned, and on every call after the first.
  std::vector<uint8_t> take() const;
  // Asks the transport to cancel this operation: unless it completes first, it completes with
  // CancelledError once no request can touch its buffer any more. Never blocks or throws;
  // harmless on a completed operation and after the transport was destroyed.
  void cancel() const;
  // The failure kind once done (kNone on success or while pending).
  FailKind error_kind() const;

 private:
  std::shared_ptr<detail::OpState> s_;
};
using SendHandle = OpHandle;
using RecvHandle = OpHandle;

}  // namespace geoloco::transport

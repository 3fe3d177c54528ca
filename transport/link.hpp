// Link: what the protocol (channel.hpp) asks of the binding that carries one peer's frames --
// UCX active messages (ucx/), or the in-memory fabric of the tests (memory/).
//
// Calls happen on the transport's loop thread. A request that cannot complete at once
// returns nullopt and its continuation runs later, on the loop thread, exactly once; one that
// completes at once returns its result and its continuation is never called. Continuations
// are never run from inside the call that started the request (no re-entrance).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>

namespace geoloco::transport {

// A received frame's data as the binding holds it.
struct HeldData {
  void* token = nullptr;           // the binding's handle (UCX descriptor, message id); null: none
  const uint8_t* bytes = nullptr;  // readable now (eager data); null when it must be fetched
  uint64_t length = 0;
  bool needs_fetch = false;  // rendezvous: fetch() pulls it into the destination
  bool keepable = false;     // the binding can keep it past on_frame (else it is copied or refused)
};

// The channel's verdict on a held frame: kRelease: the binding frees it now; kKept: the
// channel keeps it and later calls fetch() or release() on it.
enum class Disposition { kRelease, kKept };

class Link {
 public:
  virtual ~Link() = default;
  // Lanes of this peer that can carry frames now.
  virtual bool lane_up(int lane) const = 0;
  // Sends one frame (header bytes + payload) on `lane`, eagerly when asked. The buffers stay
  // valid until completion. Result: "" sent, otherwise why it failed.
  using SendDone = std::function<void(const std::string& error)>;
  virtual std::optional<std::string> send_frame(int lane, std::span<const uint8_t> header,
                                                std::span<const uint8_t> payload, bool eager, SendDone done) = 0;
  // Pulls held data (needs_fetch) into `dst`. Result: "" and the bytes that landed, or why not.
  struct Fetched {
    std::string error;
    uint64_t length = 0;
  };
  using FetchDone = std::function<void(const Fetched&)>;
  virtual std::optional<Fetched> fetch(const HeldData& data, std::span<uint8_t> dst, FetchDone done) = 0;
  // Frees held data the channel kept and will not fetch.
  virtual void release(const HeldData& data) = 0;
  // The peer failed: close its lanes, so every request still in flight completes soon (with
  // an error). Called once, outside any continuation.
  virtual void abort() = 0;
};

}  // namespace geoloco::transport

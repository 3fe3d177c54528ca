// HandshakeSession: the authentication of one connection, either side, as a state machine
// without I/O (handshake.hpp has the messages, README.md "Handshake" the protocol).
//
// The gate drives it over TCP (blocking reads with a deadline), the UCX lanes over active
// messages, the in-memory backend over direct calls: one implementation of every check.
//
//   dialer:   hello() -> [HELLO_ACK] -> AUTH -> [AUTH_OK] -> authenticated
//   listener: [HELLO] -> HELLO_ACK -> [AUTH] -> AUTH_OK -> authenticated
//
// Every step returns what to send (if anything) and the outcome. A refusal sends a REJECT
// naming the reason; a REJECT from the peer ends the session with its reason. Which
// refusals are fatal is the caller's business: a dialer cannot fix a wrong key by retrying,
// while a listener must not let an impostor abort the run (README.md, "Connection setup").
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "transport/handshake.hpp"
#include "transport/peer.hpp"

namespace geoloco::transport {

// What this side puts in its HELLO / HELLO_ACK and checks in the peer's.
struct HsLocal {
  Identity self;
  uint64_t chunk_bytes = 0;
  uint16_t lanes = 1;
  uint16_t version = kProtocolVersion;
  std::vector<uint8_t> psk;
};

// Fields both sides must agree on; "" when a peer's hello matches ours (the lane is the
// caller's to check: the gate's is kGateLane).
std::string hello_mismatch(const HsMessage& m, const HsLocal& local);

class HandshakeSession {
 public:
  enum class Outcome {
    kPending,        // send `reply` (if any) and wait for the next message
    kAuthenticated,  // done: send `reply` (if any); the connection is the peer's
    kRefused,        // we refused: send `reply` (a REJECT), then close
    kRejected,       // the peer refused us (`error` is its reason); close
  };
  struct Step {
    std::optional<std::vector<uint8_t>> reply;  // an encoded message to send
    Outcome outcome = Outcome::kPending;
    std::string error;  // why, for kRefused / kRejected
  };
  // A listener's check of the peer a HELLO claims to be (after the common fields matched):
  // "" admits it, anything else is the refusal's reason.
  using Admit = std::function<std::string(const HsMessage& hello)>;

  // Dialer of `peer_site/peer_rank` on `lane`. `expect_port`: the AUTH_OK must carry a port
  // (the gate's answer), read back with port().
  static HandshakeSession dialer(HsLocal local, std::string peer_site, int peer_rank, uint16_t lane, bool expect_port);
  // Listener: `admit` checks the claimed peer; `port` goes into our AUTH_OK (0 on UCX lanes).
  static HandshakeSession listener(HsLocal local, Admit admit, uint32_t port);

  // The dialer's HELLO (fresh nonce); call once, first.
  std::vector<uint8_t> hello();
  // Feeds one message from the peer.
  Step on_message(std::span<const uint8_t> bytes);

  bool is_dialer() const { return dialer_; }
  bool done() const { return state_ == State::kDone; }
  // Known after the peer's HELLO (listener) or from the start (dialer).
  const std::string& peer_site() const { return peer_site_; }
  int peer_rank() const { return peer_rank_; }
  uint16_t lane() const { return lane_; }
  // The port the listener's AUTH_OK carried (dialer with expect_port).
  uint32_t port() const { return port_; }

  // A REJECT for `reason` (e.g. a handshake deadline that passed), encoded.
  static std::vector<uint8_t> reject(uint16_t version, const std::string& reason);

 private:
  enum class State { kStart, kAwaitAck, kAwaitAuthOk, kAwaitHello, kAwaitAuth, kDone, kFailed };
  HandshakeSession() = default;
  Step refuse(const std::string& reason);
  HsMessage my_hello(HsType type) const;
  HsTranscript transcript() const;
  Step on_hello(const HsMessage& m);
  Step on_hello_ack(const HsMessage& m);
  Step on_auth(const HsMessage& m);
  Step on_auth_ok(const HsMessage& m);

  HsLocal local_;
  Admit admit_;
  bool dialer_ = false;
  bool expect_port_ = false;
  State state_ = State::kStart;
  std::string peer_site_;
  int peer_rank_ = 0;
  uint16_t lane_ = 0;
  uint32_t port_ = 0;
  Nonce my_nonce_{};
  Nonce peer_nonce_{};
};

}  // namespace geoloco::transport

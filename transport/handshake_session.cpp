// HandshakeSession: one connection's authentication as a state machine (handshake_session.hpp).
#include "transport/handshake_session.hpp"

#include <fmt/format.h>

#include "core/hash.hpp"
#include "transport/site_directory.hpp"

namespace geoloco::transport {

std::string hello_mismatch(const HsMessage& m, const HsLocal& local) {
  if (m.run_id != local.self.run_id)
    return fmt::format("run id mismatch: peer '{}', ours '{}'", m.run_id, local.self.run_id);
  if (m.config_hash != local.self.config_hash)
    return fmt::format("config hash mismatch: peer {}, ours {}", hex64(m.config_hash), hex64(local.self.config_hash));
  if (m.chunk_bytes != local.chunk_bytes)
    return fmt::format("chunk_bytes mismatch: peer {}, ours {}", m.chunk_bytes, local.chunk_bytes);
  if (m.lanes != local.lanes) return fmt::format("lanes mismatch: peer {}, ours {}", m.lanes, local.lanes);
  if (m.lane != kGateLane && m.lane != kDirectoryLane && m.lane >= m.lanes)
    return fmt::format("lane {} out of range (lanes {})", m.lane, m.lanes);
  return {};
}

HandshakeSession HandshakeSession::dialer(HsLocal local, std::string peer_site, int peer_rank, uint16_t lane,
                                          bool expect_port) {
  HandshakeSession s;
  s.local_ = std::move(local);
  s.dialer_ = true;
  s.expect_port_ = expect_port;
  s.peer_site_ = std::move(peer_site);
  s.peer_rank_ = peer_rank;
  s.lane_ = lane;
  return s;
}

HandshakeSession HandshakeSession::listener(HsLocal local, Admit admit, uint32_t port) {
  HandshakeSession s;
  s.local_ = std::move(local);
  s.admit_ = std::move(admit);
  s.port_ = port;
  s.state_ = State::kAwaitHello;
  return s;
}

std::vector<uint8_t> HandshakeSession::reject(uint16_t version, const std::string& reason) {
  HsMessage m;
  m.version = version;
  m.type = HsType::kReject;
  m.reason = reason;
  return m.encode();
}

HsMessage HandshakeSession::my_hello(HsType type) const {
  HsMessage m;
  m.version = local_.version;
  m.type = type;
  m.run_id = local_.self.run_id;
  m.config_hash = local_.self.config_hash;
  m.chunk_bytes = local_.chunk_bytes;
  m.lanes = local_.lanes;
  m.lane = lane_;
  m.site = local_.self.site;
  m.rank = local_.self.rank;
  m.nonce = my_nonce_;
  return m;
}

HsTranscript HandshakeSession::transcript() const {
  HsTranscript t;
  t.run_id = local_.self.run_id;
  t.config_hash = local_.self.config_hash;
  t.lane = lane_;
  if (dialer_) {
    t.dialer_site = local_.self.site, t.dialer_rank = local_.self.rank, t.dialer_nonce = my_nonce_;
    t.listener_site = peer_site_, t.listener_rank = peer_rank_, t.listener_nonce = peer_nonce_;
  } else {
    t.dialer_site = peer_site_, t.dialer_rank = peer_rank_, t.dialer_nonce = peer_nonce_;
    t.listener_site = local_.self.site, t.listener_rank = local_.self.rank, t.listener_nonce = my_nonce_;
  }
  return t;
}

std::vector<uint8_t> HandshakeSession::hello() {
  my_nonce_ = random_nonce();
  state_ = State::kAwaitAck;
  return my_hello(HsType::kHello).encode();
}

HandshakeSession::Step HandshakeSession::refuse(const std::string& reason) {
  state_ = State::kFailed;
  Step s;
  s.reply = reject(local_.version, reason);
  s.outcome = Outcome::kRefused;
  s.error = reason;
  return s;
}

HandshakeSession::Step HandshakeSession::on_message(std::span<const uint8_t> bytes) {
  if (state_ == State::kFailed || state_ == State::kDone || state_ == State::kStart)
    return refuse("unexpected handshake message");
  HsDecoded d = decode_handshake(bytes, local_.version);
  if (!d.msg) return refuse(d.error);
  const HsMessage& m = *d.msg;
  if (m.type == HsType::kReject) {
    state_ = State::kFailed;
    Step s;
    s.outcome = Outcome::kRejected;
    s.error = m.reason;
    return s;
  }
  switch (state_) {
    case State::kAwaitHello:
      if (m.type != HsType::kHello) return refuse("expected hello");
      return on_hello(m);
    case State::kAwaitAck:
      if (m.type != HsType::kHelloAck) return refuse("expected hello-ack");
      return on_hello_ack(m);
    case State::kAwaitAuth:
      if (m.type != HsType::kAuth) return refuse("expected auth");
      return on_auth(m);
    case State::kAwaitAuthOk:
      if (m.type != HsType::kAuthOk) return refuse("expected auth-ok");
      return on_auth_ok(m);
    default: return refuse("unexpected handshake message");
  }
}

// Listener: a dialer introduced itself.
HandshakeSession::Step HandshakeSession::on_hello(const HsMessage& m) {
  peer_site_ = m.site;
  peer_rank_ = m.rank;
  lane_ = m.lane;
  // Who it claims to be first (the caller records refusals of known peers), then the fields.
  if (admit_)
    if (std::string e = admit_(m); !e.empty()) return refuse(e);
  if (std::string e = hello_mismatch(m, local_); !e.empty()) return refuse(e);
  peer_nonce_ = m.nonce;
  my_nonce_ = random_nonce();
  HsMessage ack = my_hello(HsType::kHelloAck);
  ack.mac = compute_mac(local_.psk, transcript(), "listener");
  state_ = State::kAwaitAuth;
  Step s;
  s.reply = ack.encode();
  return s;
}

// Dialer: the listener answered; check it is who we dialed and that it knows the key.
HandshakeSession::Step HandshakeSession::on_hello_ack(const HsMessage& m) {
  if (m.site != peer_site_ || m.rank != peer_rank_)
    return refuse(fmt::format("dialed {}/{} but {}/{} answered", peer_site_, peer_rank_, m.site, m.rank));
  if (std::string e = hello_mismatch(m, local_); !e.empty()) return refuse(e);
  if (m.lane != lane_) return refuse(fmt::format("lane mismatch: asked {}, got {}", lane_, m.lane));
  peer_nonce_ = m.nonce;
  const HsTranscript t = transcript();
  if (!mac_equal(m.mac, compute_mac(local_.psk, t, "listener")))
    return refuse("authentication failed: the listener's HMAC does not verify (different pre-shared key?)");
  HsMessage auth;
  auth.version = local_.version;
  auth.type = HsType::kAuth;
  auth.mac = compute_mac(local_.psk, t, "dialer");
  state_ = State::kAwaitAuthOk;
  Step s;
  s.reply = auth.encode();
  return s;
}

// Listener: the dialer proved it knows the key.
HandshakeSession::Step HandshakeSession::on_auth(const HsMessage& m) {
  if (!mac_equal(m.mac, compute_mac(local_.psk, transcript(), "dialer")))
    return refuse("authentication failed: the dialer's HMAC does not verify (different pre-shared key?)");
  HsMessage ok;
  ok.version = local_.version;
  ok.type = HsType::kAuthOk;
  ok.port = port_;
  state_ = State::kDone;
  Step s;
  s.reply = ok.encode();
  s.outcome = Outcome::kAuthenticated;
  return s;
}

// Dialer: the listener accepted our proof.
HandshakeSession::Step HandshakeSession::on_auth_ok(const HsMessage& m) {
  if (expect_port_ && (m.port == 0 || m.port > 65535)) return refuse("bad auth-ok");
  port_ = m.port;
  state_ = State::kDone;
  Step s;
  s.outcome = Outcome::kAuthenticated;
  return s;
}

}  // namespace geoloco::transport

// HandshakeSession without any I/O: both sides fed each other's messages directly.
#include <gtest/gtest.h>

#include "tests/transport/test_util.hpp"
#include "transport/handshake_session.hpp"

using namespace geoloco::transport;
using namespace geoloco::transport::test;
using O = HandshakeSession::Outcome;

namespace {

HsLocal local(const std::string& site, const std::string& key = "geoloco-test-key-0123456789") {
  return HsLocal{ident(site), 65536, 2, kProtocolVersion, key_bytes(key)};
}

// Runs dialer <-> listener to the end; returns (dialer's last step, listener's last step).
struct Run {
  HandshakeSession::Step d, l;
  int messages = 0;
};
Run run(HandshakeSession& d, HandshakeSession& l) {
  Run r;
  std::vector<uint8_t> msg = d.hello();
  bool to_l = true;
  while (true) {
    ++r.messages;
    auto step = (to_l ? l : d).on_message(msg);
    (to_l ? r.l : r.d) = step;
    if (step.outcome == O::kRefused) {
      // The refusal reaches the other side as a REJECT.
      (to_l ? r.d : r.l) = (to_l ? d : l).on_message(*step.reply);
      return r;
    }
    if (!step.reply) return r;
    msg = *step.reply;
    to_l = !to_l;
  }
}

}  // namespace

TEST(HandshakeSession, AuthenticatesBothSidesInFourMessages) {
  auto d = HandshakeSession::dialer(local("a"), "b", 0, 1, false);
  std::string claimed;
  auto l = HandshakeSession::listener(
      local("b"),
      [&](const HsMessage& h) {
        claimed = h.site;
        return std::string();
      },
      4321);
  auto r = run(d, l);
  EXPECT_EQ(r.messages, 4);
  EXPECT_EQ(r.d.outcome, O::kAuthenticated);
  EXPECT_EQ(r.l.outcome, O::kAuthenticated);
  EXPECT_TRUE(d.done() && l.done());
  EXPECT_EQ(claimed, "a");
  EXPECT_EQ(l.peer_site(), "a");
  EXPECT_EQ(l.lane(), 1);
  EXPECT_EQ(d.port(), 4321u);
}

TEST(HandshakeSession, WrongKeyIsCaughtByTheDialerFirst) {
  auto d = HandshakeSession::dialer(local("a"), "b", 0, 0, false);
  auto l = HandshakeSession::listener(local("b", "another-key-entirely-0000"), nullptr, 0);
  auto r = run(d, l);
  EXPECT_EQ(r.d.outcome, O::kRefused);
  EXPECT_TRUE(contains(r.d.error, "the listener's HMAC does not verify")) << r.d.error;
  EXPECT_EQ(r.l.outcome, O::kRejected);
  EXPECT_EQ(r.l.error, r.d.error);
}

// A dialer that does not know the key cannot produce an AUTH the listener accepts, even if
// it skips checking the listener (a forged AUTH).
TEST(HandshakeSession, ForgedAuthIsRefusedByTheListener) {
  auto l = HandshakeSession::listener(local("b"), nullptr, 0);
  auto d = HandshakeSession::dialer(local("a"), "b", 0, 0, false);
  auto ack = l.on_message(d.hello());
  ASSERT_EQ(ack.outcome, O::kPending);
  HsMessage auth;
  auth.type = HsType::kAuth;
  auth.mac.fill(0x5A);
  auto step = l.on_message(auth.encode());
  EXPECT_EQ(step.outcome, O::kRefused);
  EXPECT_TRUE(contains(step.error, "the dialer's HMAC does not verify")) << step.error;
  ASSERT_TRUE(step.reply);
  EXPECT_EQ(decode_handshake(*step.reply, kProtocolVersion).msg->type, HsType::kReject);
}

TEST(HandshakeSession, AdmitRefusesBeforeTheFieldsAndNamesTheReason) {
  auto d = HandshakeSession::dialer(local("a"), "b", 0, 0, false);
  auto l = HandshakeSession::listener(
      local("b"), [](const HsMessage&) { return std::string("a/0 is not one of our peers"); }, 0);
  auto r = run(d, l);
  EXPECT_EQ(r.l.outcome, O::kRefused);
  EXPECT_EQ(r.l.error, "a/0 is not one of our peers");
  EXPECT_EQ(r.d.outcome, O::kRejected);
  EXPECT_EQ(r.d.error, "a/0 is not one of our peers");
}

TEST(HandshakeSession, MismatchedFieldsAreRefused) {
  auto other = local("a");
  other.self.config_hash = 0xBAD;
  auto d = HandshakeSession::dialer(other, "b", 0, 0, false);
  auto l = HandshakeSession::listener(local("b"), nullptr, 0);
  auto r = run(d, l);
  EXPECT_EQ(r.l.error, "config hash mismatch: peer 0000000000000bad, ours 0000000000c0ffee");
  auto lanes = local("a");
  lanes.lanes = 3;
  auto d2 = HandshakeSession::dialer(lanes, "b", 0, 0, false);
  auto l2 = HandshakeSession::listener(local("b"), nullptr, 0);
  EXPECT_EQ(run(d2, l2).l.error, "lanes mismatch: peer 3, ours 2");
}

TEST(HandshakeSession, AnswerFromSomeoneElseAndOutOfOrderMessagesAreRefused) {
  // The dialer called b but c answered.
  auto d = HandshakeSession::dialer(local("a"), "b", 0, 0, false);
  auto l = HandshakeSession::listener(local("c"), nullptr, 0);
  auto r = run(d, l);
  EXPECT_EQ(r.d.error, "dialed b/0 but c/0 answered");
  // A listener that gets AUTH first.
  auto l2 = HandshakeSession::listener(local("b"), nullptr, 0);
  HsMessage auth;
  auth.type = HsType::kAuth;
  EXPECT_EQ(l2.on_message(auth.encode()).error, "expected hello");
  // Garbage.
  auto l3 = HandshakeSession::listener(local("b"), nullptr, 0);
  std::vector<uint8_t> junk(40, 0x11);
  EXPECT_EQ(l3.on_message(junk).outcome, O::kRefused);
  // A finished session takes nothing more.
  auto d4 = HandshakeSession::dialer(local("a"), "b", 0, 0, false);
  auto l4 = HandshakeSession::listener(local("b"), nullptr, 0);
  run(d4, l4);
  EXPECT_EQ(l4.on_message(d4.hello()).outcome, O::kRefused);
}

TEST(HandshakeSession, GateAuthOkMustCarryAPort) {
  auto d = HandshakeSession::dialer(local("a"), "b", 0, kGateLane, /*expect_port=*/true);
  auto l = HandshakeSession::listener(local("b"), nullptr, 0);
  auto r = run(d, l);
  EXPECT_EQ(r.d.outcome, O::kRefused);
  EXPECT_EQ(r.d.error, "bad auth-ok");
}

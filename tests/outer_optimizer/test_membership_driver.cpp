// The membership consensus over a real Transport (the in-memory fabric): four site leaders
// agree on a round's membership; a site killed before or during the round is left out and
// the others agree; a stalled site is left out too; below the quorum the wait ends with
// QuorumLost naming the reachable sites; garbage from a peer is refused naming it.
#include <gtest/gtest.h>

#include <future>
#include <thread>
#include <variant>

#include "outer_optimizer/membership_driver.hpp"
#include "tests/outer_optimizer/memory_leaders.hpp"
#include "tests/transport/memory_cluster.hpp"

namespace geoloco::outer {
namespace {

using transport::test::MemoryCluster;

const std::vector<std::string> kNames = {"paris", "lyon", "nice", "lille"};

struct Leaders : geoloco::testing::MemoryLeaders {
  explicit Leaders(int count)
      : MemoryLeaders(std::vector<std::string>(kNames.begin(), kNames.begin() + count), /*transfer_timeout_s=*/3) {}
  ConsensusConfig cc(int s, int quorum) const {
    return {.sites = static_cast<int>(sites.size()), .self = s, .quorum = quorum, .retry_s = 0.2, .degrade_s = 0.1};
  }
  // Runs agree_membership on every listed site in parallel; each one's outcome or error text.
  std::vector<std::variant<MembershipOutcome, std::string>> agree(const std::vector<int>& sites, int quorum,
                                                                  std::vector<SiteMask> holds, double wait_s = 5) {
    std::vector<std::future<std::variant<MembershipOutcome, std::string>>> f;
    for (int s : sites)
      f.push_back(std::async(std::launch::async, [&, s]() -> std::variant<MembershipOutcome, std::string> {
        try {
          return agree_membership(*peers[static_cast<size_t>(s)], cc(s, quorum), 3, holds[static_cast<size_t>(s)],
                                  wait_s);
        } catch (const std::exception& e) {
          return std::string(e.what());
        }
      }));
    std::vector<std::variant<MembershipOutcome, std::string>> out;
    for (auto& x : f) out.push_back(x.get());
    return out;
  }
};

MembershipOutcome ok(const std::variant<MembershipOutcome, std::string>& v) {
  if (auto* e = std::get_if<std::string>(&v)) {
    ADD_FAILURE() << "failed: " << *e;
    return {};
  }
  return std::get<MembershipOutcome>(v);
}

TEST(MembershipDriver, FourLeadersAgreeOnEveryone) {
  Leaders L(4);
  const auto r = L.agree({0, 1, 2, 3}, 3, std::vector<SiteMask>(4, 0b1111));
  for (int s = 0; s < 4; ++s) {
    const auto o = ok(r[static_cast<size_t>(s)]);
    EXPECT_EQ(o.members, 0b1111u) << "site " << s;
    EXPECT_TRUE(o.can_apply);
  }
  EXPECT_EQ(ok(r[0]).ballots, 1);  // the lowest site proposes, once
}

TEST(MembershipDriver, SiteKilledBeforeTheRoundIsLeftOut) {
  Leaders L(4);
  L.cluster->fabric.kill("lille", 0);
  const auto r = L.agree({0, 1, 2}, 3, std::vector<SiteMask>(4, 0b0111));
  for (int s = 0; s < 3; ++s) EXPECT_EQ(ok(r[static_cast<size_t>(s)]).members, 0b0111u) << "site " << s;
}

TEST(MembershipDriver, FirstSiteKilledMidConsensusTheOthersGoOn) {
  Leaders L(4);
  // Site 0 (paris) dies after its first few frames: prepares out, the rest never.
  transport::memory::Fault f;
  f.action = transport::memory::FaultAction::kKill;
  f.from_site = "paris";
  f.from_rank = 0;
  f.kind = transport::FrameKind::kControl;
  f.nth = 3;  // prepares to lyon and nice leave; paris dies before the one to lille
  L.cluster->fabric.add_fault(f);
  std::vector<SiteMask> holds = {0b1111, 0b1110, 0b1110, 0b1110};
  const auto r = L.agree({0, 1, 2, 3}, 3, holds, /*wait_s=*/2);
  for (int s = 1; s < 4; ++s) EXPECT_EQ(ok(r[static_cast<size_t>(s)]).members, 0b1110u) << "site " << s;
  // The dead site never decides on its own: it learns nothing (an error), or, when the
  // others' decide reached it before its connection went (a loaded machine), their
  // membership, which leaves it out.
  if (!std::holds_alternative<std::string>(r[0])) {
    EXPECT_EQ(ok(r[0]).members, 0b1110u);
  }
}

TEST(MembershipDriver, StalledSiteIsLeftOut) {
  Leaders L(4);
  L.cluster->fabric.stall("nice", 0);
  std::vector<SiteMask> holds = {0b1011, 0b1011, 0b1111, 0b1011};
  const auto r = L.agree({0, 1, 3}, 3, holds);
  for (int s : {0, 1, 2}) EXPECT_EQ(ok(r[static_cast<size_t>(s)]).members, 0b1011u);
  L.cluster->fabric.resume("nice", 0);
}

TEST(MembershipDriver, BelowQuorumTheWaitEndsNamingWhoIsReachable) {
  Leaders L(4);
  L.cluster->fabric.kill("nice", 0);
  L.cluster->fabric.kill("lille", 0);
  const auto r = L.agree({0, 1}, 3, std::vector<SiteMask>(4, 0b0011), /*wait_s=*/1.0);
  for (int s = 0; s < 2; ++s) {
    const auto* e = std::get_if<std::string>(&r[static_cast<size_t>(s)]);
    ASSERT_NE(e, nullptr) << "site " << s << " decided below the quorum";
    EXPECT_NE(e->find("no membership agreed within 1.0 s"), std::string::npos) << *e;
    EXPECT_NE(e->find("2 of 4 sites reachable {0,1}"), std::string::npos) << *e;
    EXPECT_NE(e->find("min_sites 3"), std::string::npos) << *e;
  }
}

TEST(MembershipDriver, MinSitesOneLoneSurvivorDecides) {
  Leaders L(4);
  for (const char* s : {"paris", "nice", "lille"}) L.cluster->fabric.kill(s, 0);
  const auto r = L.agree({1}, 1, std::vector<SiteMask>(4, 0b0010));
  EXPECT_EQ(ok(r[0]).members, 0b0010u);
}

TEST(MembershipDriver, GarbageFromAPeerIsRefusedNamingIt) {
  Leaders L(2);
  // lyon sends a control message of the membership kind whose body is not a GLMB record.
  std::vector<uint8_t> junk(kMemberMsgBytes, 0xAB);
  auto h = L.peers[1]->send(0, EnvelopeKind::kMembership, 3, kMembershipShard, 0, junk);
  try {
    agree_membership(*L.peers[0], L.cc(0, 2), 3, 0b11, 2);
    ADD_FAILURE() << "garbage accepted";
  } catch (const MembershipError& e) {
    EXPECT_NE(std::string(e.what()).find("lyon"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("magic"), std::string::npos) << e.what();
  }
}

// Paris held every contribution early and votes at once; lyon is still waiting out its
// exchange deadline and votes 1.5 s later, past paris's 0.5 s wait. Paris, having heard
// nothing from lyon's live link this round, waits the grace (the deadline) longer, and the
// two decide. Without the grace it gives up first (the reason for it).
TEST(MembershipDriver, AnEarlyVoterWaitsForALiveSiteStillInItsExchange) {
  for (double grace : {3.0, 0.0}) {
    Leaders l(2);
    auto late = std::async(std::launch::async, [&]() -> std::variant<MembershipOutcome, std::string> {
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      try {
        return agree_membership(*l.peers[1], l.cc(1, 2), 3, 0b11, 5);
      } catch (const std::exception& e) {
        return std::string(e.what());
      }
    });
    std::variant<MembershipOutcome, std::string> early;
    try {
      early = agree_membership(*l.peers[0], l.cc(0, 2), 3, 0b11, 0.5, nullptr, grace);
    } catch (const std::exception& e) {
      early = std::string(e.what());
    }
    if (grace > 0) {
      EXPECT_EQ(ok(early).members, SiteMask{0b11});
      EXPECT_EQ(ok(late.get()).members, SiteMask{0b11});
    } else {
      ASSERT_TRUE(std::holds_alternative<std::string>(early));
      EXPECT_NE(std::get<std::string>(early).find("no membership agreed within 0.5 s"), std::string::npos);
      late.wait();
    }
  }
}

}  // namespace
}  // namespace geoloco::outer

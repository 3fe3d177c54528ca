// The join's state transfer on its own, over the in-memory fabric: three site leaders, two of
// them donors. A donor whose manifest disagrees with the others' is not used, and the joiner
// tells it so at once: it stops serving, and its connection to the joiner outlives the
// transfer timeout it would otherwise have run into (the next round would have left the
// joiner out).
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <thread>

#include "outer_optimizer/state_transfer.hpp"
#include "tests/outer_optimizer/memory_leaders.hpp"
#include "tests/transport/memory_cluster.hpp"
#include "core/hash.hpp"

namespace geoloco::outer {
namespace {

using transport::test::MemoryCluster;

struct Sites : geoloco::testing::MemoryLeaders {
  Sites(const std::vector<std::string>& names, double transfer_timeout_s) : MemoryLeaders(names, transfer_timeout_s) {}
  OuterHooks hooks;
};

std::shared_ptr<JoinSnapshot> snapshot(uint8_t fill, SiteMask members) {
  auto snap = std::make_shared<JoinSnapshot>();
  snap->state.assign(10000, fill);
  snap->manifest = describe_state(snap->state, 4096, 7, 70, members, 0x1234);
  return snap;
}

TEST(StateTransfer, ADonorNotUsedIsToldAndItsConnectionOutlivesTheTransferTimeout) {
  Sites sites({"paris", "lyon", "milan"}, 1.0);
  // paris and milan serve lyon; milan's state differs (a bad snapshot): a tie, the lowest site wins.
  JoinDonor paris(*sites.peers[0], 1, snapshot(1, 0b111), 120, sites.hooks);
  JoinDonor milan(*sites.peers[2], 1, snapshot(2, 0b111), 120, sites.hooks);
  const JoinResult r = fetch_join_state(*sites.peers[1], 10);
  EXPECT_EQ(r.donors, SiteMask{0b001});
  EXPECT_EQ(r.state, std::vector<uint8_t>(10000, 1));
  ASSERT_EQ(r.notes.size(), 1u);
  EXPECT_NE(r.notes[0].find("disagrees with the others'"), std::string::npos) << r.notes[0];
  // Both donors are done within moments, milan included (it was told, not left waiting).
  const auto t0 = std::chrono::steady_clock::now();
  while ((!paris.finished() || !milan.finished()) && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5))
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_TRUE(paris.finished());
  EXPECT_TRUE(milan.finished());
  // Past the transfer timeout the milan <-> lyon connection still carries a message.
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  auto recv = sites.peers[1]->post_recv(2, 9, 77, 16);
  const std::vector<uint8_t> body = {4, 2};
  sites.peers[2]->send(1, EnvelopeKind::kSplitStatus, 9, 77, 0, body).wait();
  std::vector<uint8_t> bytes;
  const Envelope e = sites.peers[1]->read(recv, 2, EnvelopeKind::kSplitStatus, 9, bytes, 16);
  EXPECT_EQ(std::vector<uint8_t>(e.body.begin(), e.body.end()), body);
}

}  // namespace
}  // namespace geoloco::outer

// The UCX binding over TCP loopback: the backend-generic tests, then what only UCX has --
// the gate in front of the UCX listener (garbage, floods, late peers, missing peers), UCX's
// rendezvous, its environment defaults, and a peer process killed mid-transfer.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <map>

#include "tests/support/ports.hpp"
#include "tests/transport/backend_fault_tests.hpp"
#include "tests/transport/backend_tests.hpp"
#include "tests/transport/ucx_cluster.hpp"
#include "transport/site_directory.hpp"
#include "transport/ucx/gate.hpp"
#include "transport/ucx/ucx_env.hpp"

using namespace geoloco::transport;
using namespace geoloco::transport::test;
using geoloco::transport::ucx::UcxTransport;

INSTANTIATE_TYPED_TEST_SUITE_P(Ucx, BackendTest, UcxCluster);
INSTANTIATE_TYPED_TEST_SUITE_P(Ucx, BackendFaultTest, UcxCluster);

namespace {

int tcp_connect(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Why `t`'s request for the directory of `rank0`'s site failed ("" when it did not).
std::string directory_error(const UcxTransport& t, const PeerInfo& rank0, int ranks, double timeout_s = 0) {
  try {
    t.site_directory(rank0, ranks, timeout_s);
  } catch (const TransportError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

// A message of at most eager_bytes skips the rendezvous; a longer one is UCX's choice
// (rendezvous for 1 MiB chunks over TCP), none of it eager. Counted at the receiver.
TEST(UcxTransport, MessagesWithinEagerBytesSkipTheRendezvous) {
  const uint64_t chunk = 1 << 20;
  const auto data = pattern(4 * chunk + 5, 9);  // chunks at 0, 1, 2, 3 MiB and a 5-byte tail
  std::map<uint64_t, uint64_t> rndv;            // eager_bytes -> frames received by rendezvous
  for (const uint64_t eager : {uint64_t{0}, 2 * chunk, 8 * chunk}) {
    std::vector<TransportConfig> cfgs(2, small_config(1, chunk));
    for (auto& cfg : cfgs) cfg.eager_bytes = eager;
    UcxCluster c(cfgs, {ident("a"), ident("b")});
    for (auto& e : c.connect_all()) ASSERT_EQ(e, "");
    auto r = c.t[1]->recv(0, FrameKind::kPseudoGradient, 1, 0, data.size());
    auto s = c.t[0]->send(0, FrameKind::kPseudoGradient, 1, 0, P(data));
    ASSERT_TRUE(r.wait_for(std::chrono::seconds(20)));
    ASSERT_TRUE(s.wait_for(std::chrono::seconds(20)));
    EXPECT_EQ(r.take(), data) << "eager_bytes " << eager;
    const auto st = c.t[1]->stats().peers.at(0);
    EXPECT_EQ(st.frames_received, 5u);
    rndv[eager] = st.frames_received_rndv;
  }
  ASSERT_EQ(rndv[0], 4u) << "UCX no longer uses rendezvous for 1 MiB over TCP: the test's baseline changed";
  EXPECT_EQ(rndv[2 * chunk], 4u);
  EXPECT_EQ(rndv[8 * chunk], 0u);
}

TEST(UcxTransport, InterfaceForAddress) {
  EXPECT_EQ(ucx::interface_for_address("127.0.0.1"), "lo");
  EXPECT_EQ(ucx::interface_for_address("127.0.0.2"), "lo");
  EXPECT_EQ(ucx::interface_for_address("0.0.0.0"), "");
  EXPECT_EQ(ucx::interface_for_address("not-an-ip"), "");
}

TEST(UcxTransport, UcxDefaultsPinLoopbackAndYieldToTheEnvironment) {
  {
    ucx::Config cfg;
    auto notes = ucx::apply_ucx_defaults(cfg, "127.0.0.1");
    std::string all;
    for (auto& n : notes) all += n + ";";
    EXPECT_NE(all.find("NET_DEVICES=lo;"), std::string::npos) << all;
    EXPECT_NE(all.find("TCP_CM_REUSEADDR="), std::string::npos) << all;
    if (std::getenv("UCX_TLS") == nullptr) {
      EXPECT_NE(all.find("TLS=tcp;"), std::string::npos) << all;
    }
  }
  if (std::getenv("UCX_NET_DEVICES") == nullptr) {
    ::setenv("UCX_NET_DEVICES", "all", 1);
    ucx::Config cfg;
    auto notes = ucx::apply_ucx_defaults(cfg, "127.0.0.1");
    ::unsetenv("UCX_NET_DEVICES");
    std::string all;
    for (auto& n : notes) all += n + ";";
    EXPECT_NE(all.find("NET_DEVICES=all (from the environment)"), std::string::npos) << all;
  }
}

TEST(UcxHandshake, MissingPeerTimesOutNamingIt) {
  auto cfg = small_config();
  cfg.connect_timeout_s = 1.0;
  UcxTransport t(cfg, ident("m"));
  t.listen("127.0.0.1", 0);
  int port = geoloco::test::fresh_port();  // nobody listens there
  auto t0 = Clock::now();
  std::string msg;
  try {
    // "z" would be dialed by us (retried until the deadline); "a" would dial us and never does.
    t.connect({PeerInfo{"z", 0, "127.0.0.1", port}, PeerInfo{"a", 0, "127.0.0.1", 1}});
  } catch (const TimeoutError& e) {
    msg = e.what();
  }
  double s = since(t0);
  EXPECT_GE(s, 1.0);
  EXPECT_LT(s, 3.0);
  EXPECT_TRUE(contains(msg, fmt::format("z/0 (127.0.0.1:{})", port))) << msg;
  EXPECT_TRUE(contains(msg, "a/0 (127.0.0.1:1)")) << msg;
}

// A site across nodes (docs/shapes.md): rank 0's gate serves its site's addresses to a rank
// of another site that passes the handshake on the directory lane -- before either side has
// connected (the sites look each other up first), and after set_directory, however late.
TEST(UcxDirectory, RankZerosGateServesItsSitesAddressesToAnotherSite) {
  auto cfg = small_config();
  UcxTransport lyon(cfg, ident("lyon"));
  const int port = lyon.listen("127.0.0.1", 0);
  UcxTransport paris(cfg, ident("paris"));
  paris.listen("127.0.0.1", 0);
  const std::vector<std::string> addrs = {"127.0.0.1", "127.0.0.2", "198.18.3.7", "10.1.2.3"};
  // Asked before the directory is set: the request waits for it (within the handshake deadline).
  auto asked = std::async(std::launch::async, [&] { return paris.site_directory({"lyon", 0, "127.0.0.1", port}, 4); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  lyon.set_directory(addrs);
  EXPECT_EQ(asked.get(), addrs);
  // Again, at once; and the rank count the config gives that site must match.
  EXPECT_EQ(paris.site_directory({"lyon", 0, "127.0.0.1", port}, 4), addrs);
  const std::string msg = directory_error(paris, {"lyon", 0, "127.0.0.1", port}, 2);
  EXPECT_TRUE(contains(msg, "4 ranks, the config gives that site 2")) << msg;
}

TEST(UcxDirectory, AWrongKeyOrTheSitesOwnRankIsRefused) {
  auto cfg = small_config();
  cfg.connect_timeout_s = 3;
  UcxTransport lyon(cfg, ident("lyon"));
  const int port = lyon.listen("127.0.0.1", 0);
  lyon.set_directory({"127.0.0.1", "127.0.0.2"});
  auto bad = cfg;
  bad.psk = key_bytes("another-key-0123456789-abcdef");
  UcxTransport stranger(bad, ident("paris"));
  stranger.listen("127.0.0.1", 0);
  std::string msg = directory_error(stranger, {"lyon", 0, "127.0.0.1", port}, 2);
  EXPECT_FALSE(msg.empty());
  EXPECT_FALSE(contains(msg, "127.0.0.2")) << msg;
  UcxTransport own(cfg, ident("lyon", 1));
  own.listen("127.0.0.1", 0);
  msg = directory_error(own, {"lyon", 0, "127.0.0.1", port}, 2);
  EXPECT_TRUE(contains(msg, "a directory request from this site's own rank")) << msg;
}

// A peer that hears nothing (no directory set) gives up at its deadline naming the site.
TEST(UcxDirectory, NoDirectoryTimesOutNamingTheSite) {
  auto cfg = small_config();
  cfg.handshake_timeout_s = 0.5;
  UcxTransport lyon(cfg, ident("lyon"));
  const int port = lyon.listen("127.0.0.1", 0);
  UcxTransport paris(cfg, ident("paris"));
  paris.listen("127.0.0.1", 0);
  EXPECT_THROW(paris.site_directory({"lyon", 0, "127.0.0.1", port}, 2, 1.5), TimeoutError);
  const std::string msg = directory_error(paris, {"lyon", 0, "127.0.0.1", port}, 2, 1.5);
  EXPECT_TRUE(contains(msg, fmt::format("the site directory of lyon at 127.0.0.1:{}", port))) << msg;
}

TEST(SiteDirectory, RoundTripsAndRefusesMalformedBytes) {
  const std::vector<std::string> addrs = {"198.18.0.1", "198.18.1.2", "127.0.0.1"};
  const auto b = encode_site_directory(addrs);
  ASSERT_EQ(b.size(), kDirectoryHeaderBytes + 12);
  EXPECT_EQ(decode_site_directory(b, 3, "x"), addrs);
  auto fails = [](std::vector<uint8_t> bytes, uint32_t ranks, const std::string& want) {
    try {
      decode_site_directory(bytes, ranks, "lyon/0");
    } catch (const TransportError& e) {
      EXPECT_TRUE(contains(e.what(), want)) << e.what();
      return;
    }
    ADD_FAILURE() << "accepted: " << want;
  };
  fails({b.begin(), b.begin() + 5}, 3, "shorter than its 12-byte header");
  auto m = b;
  m[0] ^= 1;
  fails(m, 3, "bad magic");
  m = b;
  m[4] = 9;
  fails(m, 3, "version 9");
  m = b;
  m[7] = 1;
  fails(m, 3, "reserved bytes");
  fails(b, 4, "3 ranks, the config gives that site 4");
  fails({b.begin(), b.end() - 1}, 3, "bytes, expected 24");
  m = b;
  m.push_back(0);
  fails(m, 3, "bytes, expected 24");
  m = b;
  std::fill(m.begin() + 16, m.begin() + 20, 0);
  fails(m, 3, "rank 1 has no address");
  EXPECT_THROW(encode_site_directory({}), TransportError);
  EXPECT_THROW(encode_site_directory({"lyon"}), TransportError);
  EXPECT_THROW(encode_site_directory({"0.0.0.0"}), TransportError);
}

TEST(UcxHandshake, LatePeerIsRetriedUntilItListens) {
  auto cfg = small_config();
  UcxTransport a(cfg, ident("a"));
  a.listen("127.0.0.1", 0);
  UcxTransport b(cfg, ident("b"));
  // b listens only 700 ms after a started dialing it.
  int port = geoloco::test::fresh_port();  // nobody listens there
  auto fa = std::async(std::launch::async, [&] { a.connect({PeerInfo{"b", 0, "127.0.0.1", port}}); });
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  ASSERT_EQ(b.listen("127.0.0.1", port), port);
  b.connect({PeerInfo{"a", 0, "127.0.0.1", 1}});  // b never dials a, so a's port is unused
  fa.get();
  std::vector<uint8_t> x = {1, 2, 3, 4, 5};
  auto r = b.recv(0, FrameKind::kControl, 0, 0, size_t{5});
  a.send(0, FrameKind::kControl, 0, 0, P(x)).wait();
  r.wait();
  EXPECT_EQ(r.take(), x);
}

TEST(UcxHandshake, GarbageOnTheListeningPortDoesNotStopALegitimatePeer) {
  auto cfg = small_config();
  cfg.handshake_timeout_s = 0.5;
  UcxTransport b(cfg, ident("b"));
  int port = b.listen("127.0.0.1", 0);
  auto garbage = pattern(64 * 1024, 77);
  std::vector<int> open_fds;
  for (int i = 0; i < 3; ++i) {
    int fd = tcp_connect(port);
    ASSERT_GE(fd, 0) << std::strerror(errno);
    // 0: garbage then close; 1: garbage and stay open; 2: a huge "length" prefix then silence.
    if (i == 2) {
      uint8_t big[16];
      std::memset(big, 0xFF, sizeof(big));
      [[maybe_unused]] auto n = ::send(fd, big, sizeof(big), MSG_NOSIGNAL);
    } else {
      [[maybe_unused]] auto n = ::send(fd, garbage.data(), garbage.size(), MSG_NOSIGNAL);
    }
    if (i == 0)
      ::close(fd);
    else
      open_fds.push_back(fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  UcxTransport a(cfg, ident("a"));
  a.listen("127.0.0.1", 0);
  auto fb = std::async(std::launch::async, [&] { b.connect({PeerInfo{"a", 0, "127.0.0.1", 1}}); });
  a.connect({PeerInfo{"b", 0, "127.0.0.1", port}});
  fb.get();
  auto x = pattern(300000, 5);
  auto r = b.recv(0, FrameKind::kPseudoGradient, 1, 0, x.size());
  a.send(0, FrameKind::kPseudoGradient, 1, 0, P(x)).wait();
  r.wait();
  EXPECT_EQ(r.take(), x);
  for (int fd : open_fds) ::close(fd);
}

TEST(UcxHandshake, FloodOfIdleConnectionsOnlyDelaysALegitimatePeer) {
  auto cfg = small_config();
  cfg.handshake_timeout_s = 0.5;  // idle clients are dropped after this
  UcxTransport b(cfg, ident("b"));
  int port = b.listen("127.0.0.1", 0);
  std::vector<int> fds;
  for (int i = 0; i < ucx::kMaxGateClients + 8; ++i) {
    int fd = tcp_connect(port);
    ASSERT_GE(fd, 0);
    fds.push_back(fd);
  }
  UcxTransport a(cfg, ident("a"));
  a.listen("127.0.0.1", 0);
  auto t0 = Clock::now();
  auto fb = std::async(std::launch::async, [&] { b.connect({PeerInfo{"a", 0, "127.0.0.1", 1}}); });
  a.connect({PeerInfo{"b", 0, "127.0.0.1", port}});
  fb.get();
  EXPECT_LT(since(t0), cfg.connect_timeout_s);
  EXPECT_GE(b.stats().gate_refused, 8u);  // the clients over the cap, at least
  for (int fd : fds) ::close(fd);
}

TEST(UcxPeers, PeerProcessKilledMidTransferFailsTheSurvivorNamingIt) {
  // Fork before any transport exists in this process (UCX state must not cross fork).
  int to_child[2], to_parent[2];
  ASSERT_EQ(::pipe(to_child), 0);
  ASSERT_EQ(::pipe(to_parent), 0);
  const size_t n = 64u << 20;
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // Child: site "b". Sends 64 MiB paced at 400 Mbit/s (~1.3 s) so the kill lands mid-way.
    auto cfg = small_config(2, 1 << 20);
    cfg.emulate.rate_mbit = 400;
    UcxTransport t(cfg, ident("b"));
    int port = t.listen("127.0.0.1", 0);
    [[maybe_unused]] auto w = ::write(to_parent[1], &port, sizeof(port));
    int pport = 0;
    if (::read(to_child[0], &pport, sizeof(pport)) != sizeof(pport)) _exit(3);
    t.connect({PeerInfo{"a", 0, "127.0.0.1", pport}});
    auto x = pattern(n, 1);
    auto r = t.recv(0, FrameKind::kPseudoGradient, 0, 0, n);
    t.send(0, FrameKind::kPseudoGradient, 0, 0, P(x)).wait();
    r.wait_for(std::chrono::seconds(30));
    _exit(0);
  }
  int cport = 0;
  ASSERT_EQ(::read(to_parent[0], &cport, sizeof(cport)), static_cast<ssize_t>(sizeof(cport)));
  auto cfg = small_config(2, 1 << 20);
  cfg.transfer_timeout_s = 3;
  std::string msg_recv, msg_send;
  double fail_s = 0;
  {
    UcxTransport a(cfg, ident("a"));
    int port = a.listen("127.0.0.1", 0);
    ASSERT_EQ(::write(to_child[1], &port, sizeof(port)), static_cast<ssize_t>(sizeof(port)));
    a.connect({PeerInfo{"b", 0, "127.0.0.1", cport}});
    auto r = a.recv(0, FrameKind::kPseudoGradient, 0, 0, n);
    auto s = a.send(0, FrameKind::kPseudoGradient, 0, 0, P(pattern(n, 2)));
    // Wait until the transfer is under way, then kill the child.
    auto t0 = Clock::now();
    while (a.stats().peers[0].bytes_received < (4u << 20) && since(t0) < 20)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    ASSERT_GT(a.stats().peers[0].bytes_received, 0u);
    ASSERT_LT(a.stats().peers[0].bytes_received, n) << "transfer finished before the kill";
    ::kill(pid, SIGKILL);
    auto tk = Clock::now();
    msg_recv = error_of(r);
    fail_s = since(tk);
    msg_send = error_of(s);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status));
  EXPECT_TRUE(contains(msg_recv, "b/0 (127.0.0.1:" + std::to_string(cport) + ")")) << msg_recv;
  // Either failure was seen by that send or it completed before the kill; never a hang.
  EXPECT_NE(msg_send, "hang");
  if (!msg_send.empty()) {
    EXPECT_TRUE(contains(msg_send, "b/0")) << msg_send;
  }
  EXPECT_LT(fail_s, cfg.transfer_timeout_s + 1.0);
  std::printf("killed peer detected after %.3f s: %s\n", fail_s, msg_recv.c_str());
}

// The port allocator: blocks held by concurrent threads and processes never overlap, a
// block with a port in use is skipped, a released block (or a dead holder's) is free again,
// fresh_port stays below the ephemeral range, and ports.sh honours the C++ side's locks and
// the other way round.
//
// Each test runs a private pool (its own lock directory) over the ports of one block claimed
// from the real pool, so no other test can be using those ports meanwhile.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <netinet/in.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <optional>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "tests/support/ports.hpp"
#include "tests/support/temp_dir.hpp"
#include "tests/support/threads.hpp"

namespace geoloco::test {
namespace {

struct PrivatePool {
  TempDir dir{"geoloco-ports-test"};
  PortBlock real = claim_ports();
  PortPool pool(int block) const { return PortPool{dir.file("locks"), real.base(), real.base() + real.size(), block}; }
};

// A listening socket on 127.0.0.1:port.
Fd listen_on(int port) {
  Fd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (::bind(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(s.get(), 1) != 0)
    throw std::runtime_error("cannot listen on " + std::to_string(port));
  return s;
}

void expect_disjoint_blocks(std::vector<int> bases, const PortPool& pool) {
  std::sort(bases.begin(), bases.end());
  for (size_t i = 0; i < bases.size(); ++i) {
    EXPECT_GE(bases[i], pool.first);
    EXPECT_LE(bases[i] + pool.block, pool.end);
    EXPECT_EQ((bases[i] - pool.first) % pool.block, 0) << bases[i];
    if (i > 0) {
      EXPECT_GE(bases[i], bases[i - 1] + pool.block) << "blocks at " << bases[i - 1] << " and " << bases[i];
    }
  }
}

TEST(Ports, ConcurrentThreadsGetDisjointBlocksUntilThePoolIsFull) {
  PrivatePool p;
  const PortPool pool = p.pool(8);  // 8 blocks of 8
  std::vector<std::optional<PortBlock>> held(8);
  run_ranks(8, [&](int r) { held[size_t(r)].emplace(claim_ports(pool)); });
  std::vector<int> bases;
  for (auto& b : held) bases.push_back(b->base());
  expect_disjoint_blocks(bases, pool);
  EXPECT_THROW(claim_ports(pool), std::runtime_error) << "a ninth block out of eight";
  const int freed = held[3]->base();
  held[3].reset();
  EXPECT_EQ(claim_ports(pool).base(), freed);
}

// Children claim blocks and hold them until the parent lets go; a child's blocks are free
// again once it has exited (the kernel drops its locks).
TEST(Ports, ConcurrentProcessesGetDisjointBlocksAndDeadHoldersReleaseThem) {
  PrivatePool p;
  const PortPool pool = p.pool(8);
  int results[2], go[2];
  ASSERT_EQ(::pipe(results), 0);
  ASSERT_EQ(::pipe(go), 0);
  std::vector<pid_t> kids;
  for (int k = 0; k < 4; ++k) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::close(results[0]);
      ::close(go[1]);
      int out[2] = {-1, -1};
      try {
        PortBlock a = claim_ports(pool), b = claim_ports(pool);
        out[0] = a.base();
        out[1] = b.base();
        [[maybe_unused]] auto n = ::write(results[1], out, sizeof(out));
        char c;
        while (::read(go[0], &c, 1) > 0) {}
      } catch (...) {
        [[maybe_unused]] auto n = ::write(results[1], out, sizeof(out));
      }
      ::_exit(0);
    }
    kids.push_back(pid);
  }
  ::close(results[1]);
  ::close(go[0]);
  std::vector<int> bases;
  for (size_t i = 0; i < kids.size(); ++i) {
    int got[2];
    ASSERT_EQ(::read(results[0], got, sizeof(got)), ssize_t(sizeof(got)));
    bases.insert(bases.end(), got, got + 2);
  }
  ASSERT_EQ(std::count(bases.begin(), bases.end(), -1), 0) << "a child could not claim its blocks";
  expect_disjoint_blocks(bases, pool);
  EXPECT_THROW(claim_ports(pool), std::runtime_error) << "the children hold every block";
  ::close(go[1]);  // the children return and exit
  for (pid_t pid : kids) ::waitpid(pid, nullptr, 0);
  ::close(results[0]);
  std::vector<PortBlock> again;
  for (int i = 0; i < 8; ++i) again.push_back(claim_ports(pool));
  EXPECT_EQ(again.size(), 8u);
}

TEST(Ports, ABlockWithAPortInUseIsSkipped) {
  PrivatePool p;
  const PortPool pool = p.pool(32);  // blocks at base and base + 32
  const int b0 = pool.first, b1 = pool.first + 32;
  {
    Fd busy = listen_on(b0 + 5);
    EXPECT_EQ(claim_ports(pool).base(), b1);
    PortBlock only = claim_ports(pool);
    EXPECT_THROW(claim_ports(pool), std::runtime_error) << "the block with a listener was handed out";
  }
  {
    Fd busy = listen_on(b1 + 31);  // the last port of the block counts too
    EXPECT_EQ(claim_ports(pool).base(), b0);
  }
}

TEST(Ports, FreshPortsAreNewBlocksBelowTheEphemeralRange) {
  const int a = fresh_port(), b = fresh_port();
  EXPECT_GE(std::abs(a - b), kPortBlockSize);
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  int lo = 0, hi = 0;
  ASSERT_TRUE(range >> lo >> hi);
  for (int x : {a, b}) {
    EXPECT_GE(x, PortPool{}.first);
    EXPECT_LE(x + kPortBlockSize, std::min(lo, 32768));
  }
}

// Runs a bash snippet after sourcing ports.sh on the private pool; its stdout.
FILE* start_shell(const PortPool& pool, const std::string& snippet) {
  const std::string cmd =
      "GEOLOCO_TEST_PORT_DIR='" + pool.lock_dir + "' GEOLOCO_TEST_PORT_FIRST=" + std::to_string(pool.first) +
      " GEOLOCO_TEST_PORT_END=" + std::to_string(pool.end) + " GEOLOCO_TEST_PORT_BLOCK=" + std::to_string(pool.block) +
      " bash -c 'source " + GEOLOCO_PORTS_SH + "; " + snippet + "'";
  FILE* f = ::popen(cmd.c_str(), "r");
  if (f == nullptr) throw std::runtime_error("popen");
  return f;
}

std::string shell(const PortPool& pool, const std::string& snippet) {
  FILE* f = start_shell(pool, snippet);
  char buf[256];
  const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  buf[n] = 0;
  ::pclose(f);
  return buf;
}

TEST(Ports, TheShellHelperSpeaksTheSameProtocol) {
  PrivatePool p;
  const PortPool pool = p.pool(32);
  {
    PortBlock mine = claim_ports(pool);
    const std::string other = std::to_string(mine.base() == pool.first ? pool.first + 32 : pool.first);
    EXPECT_EQ(shell(pool, "geoloco_claim_ports && echo $GEOLOCO_PORT_BASE"), other + "\n");
    EXPECT_EQ(shell(pool, "geoloco_claim_ports && geoloco_claim_ports 2>/dev/null || echo full"), "full\n");
  }
  // A shell holding a block (until its sleep is ended) keeps C++ claims off it.
  FILE* f = start_shell(pool, "geoloco_claim_ports && echo $GEOLOCO_PORT_BASE $$ && exec sleep 30");
  int held = 0, pid = 0;
  ASSERT_EQ(std::fscanf(f, "%d %d", &held, &pid), 2);
  {
    PortBlock got = claim_ports(pool);
    EXPECT_NE(got.base(), held);
    EXPECT_THROW(claim_ports(pool), std::runtime_error);
  }
  ::kill(pid, SIGTERM);
  ::pclose(f);
  PortBlock x = claim_ports(pool), y = claim_ports(pool);  // both blocks: the shell's is free again
  EXPECT_TRUE(x.base() == held || y.base() == held) << held;
}

}  // namespace
}  // namespace geoloco::test

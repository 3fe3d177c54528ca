// geoloco::net over loopback: deadlines hold against a silent peer (receiving and sending),
// a closed connection is reported as such with the bytes that did arrive, transfers the
// kernel splits into partial ones arrive whole, signals (EINTR) neither fail a wait nor
// stretch its deadline, and connect/accept/listen report what went wrong.
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>
#include <vector>

#include "core/error.hpp"
#include "core/net.hpp"

namespace geoloco::net {
namespace {

using namespace std::chrono_literals;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// A connected loopback pair: `client` from try_connect, `server` from accept_until.
struct Pair {
  Fd listener, client, server;
  Pair() {
    listener = listen_tcp("127.0.0.1", 0);
    ConnectResult c = try_connect("127.0.0.1", local_port(listener.get()), Clock::now() + 5s);
    if (!c.fd) throw Error("connect: " + c.error);
    client = std::move(c.fd);
    Accepted a = accept_until(listener.get(), Clock::now() + 5s);
    if (!a.fd) throw Error("accept: " + a.error);
    server = std::move(a.fd);
  }
};

std::vector<uint8_t> pattern(size_t n) {
  std::vector<uint8_t> v(n);
  uint32_t x = 12345;
  for (auto& b : v) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<uint8_t>(x >> 24);
  }
  return v;
}

// Signals without SA_RESTART, so a blocked poll() really returns EINTR.
std::atomic<int> g_signals{0};
extern "C" void count_signal(int) { g_signals.fetch_add(1); }

struct SignalHandler {
  struct sigaction old {};
  SignalHandler() {
    struct sigaction sa {};
    sa.sa_handler = count_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;
    ::sigaction(SIGUSR1, &sa, &old);
  }
  ~SignalHandler() { ::sigaction(SIGUSR1, &old, nullptr); }
};

// Sends SIGUSR1 to `target` every 5 ms until stopped.
struct Pester {
  std::atomic<bool> stop{false};
  std::thread t;
  explicit Pester(pthread_t target) {
    t = std::thread([this, target] {
      while (!stop.load()) {
        ::pthread_kill(target, SIGUSR1);
        std::this_thread::sleep_for(5ms);
      }
    });
  }
  ~Pester() {
    stop = true;
    t.join();
  }
};

TEST(Net, RecvFromASilentPeerTimesOutAtTheDeadline) {
  Pair p;
  uint8_t buf[8];
  const auto t0 = Clock::now();
  const IoResult r = recv_all(p.client.get(), buf, sizeof(buf), t0 + 300ms);
  const double took = seconds_since(t0);
  EXPECT_EQ(r.status, IoStatus::kTimedOut);
  EXPECT_EQ(r.bytes, 0u);
  EXPECT_EQ(r.message(), "timed out");
  EXPECT_GE(took, 0.3);
  EXPECT_LT(took, 2.0);
}

TEST(Net, SendToAPeerThatNeverReadsTimesOutWithWhatWentOut) {
  Pair p;
  int small = 4096;
  ::setsockopt(p.client.get(), SOL_SOCKET, SO_SNDBUF, &small, sizeof(small));
  ::setsockopt(p.server.get(), SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
  const std::vector<uint8_t> big(32 << 20, 7);
  const auto t0 = Clock::now();
  const IoResult r = send_all(p.client.get(), big.data(), big.size(), t0 + 300ms);
  const double took = seconds_since(t0);
  EXPECT_EQ(r.status, IoStatus::kTimedOut);
  EXPECT_GT(r.bytes, 0u);
  EXPECT_LT(r.bytes, big.size());
  EXPECT_GE(took, 0.3);
  EXPECT_LT(took, 2.0);
}

TEST(Net, ClosedConnectionIsReportedWithTheBytesThatArrived) {
  Pair p;
  const uint8_t three[3] = {1, 2, 3};
  ASSERT_TRUE(send_all(p.server.get(), three, 3, Clock::now() + 2s).ok());
  p.server.reset();
  uint8_t buf[8] = {};
  const IoResult r = recv_all(p.client.get(), buf, sizeof(buf), Clock::now() + 2s);
  EXPECT_EQ(r.status, IoStatus::kClosed);
  EXPECT_EQ(r.bytes, 3u);
  EXPECT_EQ(r.message(), "connection closed by peer");
  EXPECT_EQ(std::memcmp(buf, three, 3), 0);
}

// Writing to a connection the peer closed must fail with EPIPE/ECONNRESET, not kill the
// process with SIGPIPE (this test would die if it did).
TEST(Net, SendToAClosedPeerFailsWithoutSigpipe) {
  Pair p;
  p.server.reset();
  const std::vector<uint8_t> data(1 << 20, 1);
  IoResult r;
  for (int i = 0; i < 50 && r.ok(); ++i) r = send_all(p.client.get(), data.data(), data.size(), Clock::now() + 2s);
  ASSERT_EQ(r.status, IoStatus::kError);
  EXPECT_TRUE(r.error == EPIPE || r.error == ECONNRESET) << r.message();
  EXPECT_EQ(r.message(), std::strerror(r.error));
}

// 8 MiB through 128 KiB socket buffers, read in pieces of 1..64 KiB: many partial sends
// and receives, on both a blocking and a non-blocking socket, arrive whole and in order.
// (Buffers below the loopback MSS of ~64 KiB can stall TCP itself for minutes.)
TEST(Net, PartialTransfersArriveWholeAndInOrder) {
  for (bool nonblocking : {false, true}) {
    Pair p;
    int small = 128 << 10;
    ::setsockopt(p.client.get(), SOL_SOCKET, SO_SNDBUF, &small, sizeof(small));
    ::setsockopt(p.server.get(), SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
    set_nonblocking(p.client.get(), nonblocking);
    set_nonblocking(p.server.get(), nonblocking);
    const std::vector<uint8_t> sent = pattern(8 << 20);
    std::vector<uint8_t> got(sent.size());
    IoResult rr;
    size_t pieces = 0;
    std::thread reader([&] {
      const auto deadline = Clock::now() + 20s;
      uint32_t x = 7;
      for (size_t off = 0; off < got.size() && rr.ok(); ++pieces) {
        x = x * 1664525u + 1013904223u;
        const size_t n = std::min<size_t>(got.size() - off, 1 + (x >> 16));
        rr = recv_all(p.server.get(), got.data() + off, n, deadline);
        off += rr.bytes;
      }
    });
    const IoResult sr = send_all(p.client.get(), sent.data(), sent.size(), Clock::now() + 20s);
    reader.join();
    EXPECT_TRUE(sr.ok()) << sr.message();
    EXPECT_EQ(sr.bytes, sent.size());
    EXPECT_TRUE(rr.ok()) << rr.message();
    EXPECT_GT(pieces, 100u);
    EXPECT_TRUE(got == sent) << "nonblocking " << nonblocking;
  }
}

TEST(Net, RecvAssemblesAMessageSentInPieces) {
  Pair p;
  const std::vector<uint8_t> sent = pattern(1000);
  std::thread writer([&] {
    for (size_t off = 0; off < sent.size(); off += 100) {
      ::send(p.server.get(), sent.data() + off, 100, MSG_NOSIGNAL);
      std::this_thread::sleep_for(5ms);
    }
  });
  std::vector<uint8_t> got(sent.size());
  const IoResult r = recv_all(p.client.get(), got.data(), got.size(), Clock::now() + 5s);
  writer.join();
  EXPECT_TRUE(r.ok()) << r.message();
  EXPECT_EQ(got, sent);
}

// Signals land on the waiting thread every 5 ms: the wait goes on (and ends with the data).
TEST(Net, SignalsDoNotFailAWait) {
  SignalHandler h;
  Pair p;
  g_signals = 0;
  IoResult r;
  uint8_t buf[4] = {};
  std::atomic<bool> waiting{false};
  std::thread receiver([&] {
    waiting = true;
    r = recv_all(p.client.get(), buf, sizeof(buf), Clock::now() + 10s);
  });
  while (!waiting) std::this_thread::yield();
  {
    Pester pester(receiver.native_handle());
    std::this_thread::sleep_for(300ms);
  }
  const uint8_t data[4] = {9, 8, 7, 6};
  ASSERT_TRUE(send_all(p.server.get(), data, 4, Clock::now() + 2s).ok());
  receiver.join();
  EXPECT_GT(g_signals.load(), 10) << "the signals never arrived: the test did not test EINTR";
  EXPECT_TRUE(r.ok()) << r.message();
  EXPECT_EQ(std::memcmp(buf, data, 4), 0);
}

// ... nor stretch its deadline: each retry waits only for the time left.
TEST(Net, SignalsDoNotStretchADeadline) {
  SignalHandler h;
  Pair p;
  g_signals = 0;
  Pester pester(::pthread_self());
  uint8_t buf[4];
  const auto t0 = Clock::now();
  const IoResult r = recv_all(p.client.get(), buf, sizeof(buf), t0 + 300ms);
  const double took = seconds_since(t0);
  EXPECT_EQ(r.status, IoStatus::kTimedOut);
  EXPECT_GE(took, 0.3);
  EXPECT_LT(took, 2.0);
  EXPECT_GT(g_signals.load(), 10);
}

TEST(Net, PollUntilWaitsForeverOrForTheDeadline) {
  Pair p;
  pollfd fds[1] = {{p.client.get(), POLLIN, 0}};
  auto t0 = Clock::now();
  EXPECT_EQ(poll_until(fds, t0 + 100ms), 0);
  EXPECT_GE(seconds_since(t0), 0.1);
  std::thread later([&] {
    std::this_thread::sleep_for(100ms);
    ::send(p.server.get(), "x", 1, MSG_NOSIGNAL);
  });
  EXPECT_EQ(poll_until(fds, kNoDeadline), 1);
  EXPECT_TRUE(fds[0].revents & POLLIN);
  later.join();
}

// A bound socket that does not listen: connecting to its port is refused.
struct RefusingPort {
  Fd fd{::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)};
  int port = 0;
  RefusingPort() {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) throw Error("bind");
    port = local_port(fd.get());
  }
};

TEST(Net, ConnectToNothingIsRefusedAtOnce) {
  RefusingPort nobody;
  const auto t0 = Clock::now();
  ConnectResult r = try_connect("127.0.0.1", nobody.port, t0 + 5s);
  EXPECT_FALSE(r.fd.valid());
  EXPECT_EQ(r.error, std::strerror(ECONNREFUSED));
  EXPECT_LT(seconds_since(t0), 1.0);
  EXPECT_THROW(try_connect("no-such-host.invalid", 1, t0 + 1s), Error);
}

// connect_until keeps trying until the listener appears.
TEST(Net, ConnectUntilRetriesUntilTheListenerIsUp) {
  RefusingPort later;
  std::thread up([&] {
    std::this_thread::sleep_for(300ms);
    ::listen(later.fd.get(), 4);
  });
  const auto t0 = Clock::now();
  ConnectResult r = connect_until("127.0.0.1", later.port, t0 + 5s, 1s, 20ms);
  up.join();
  EXPECT_TRUE(r.fd.valid()) << r.error;
  EXPECT_GE(seconds_since(t0), 0.25);
  // ... and gives up at the deadline with the last attempt's error.
  RefusingPort never;
  const auto t1 = Clock::now();
  ConnectResult n = connect_until("127.0.0.1", never.port, t1 + 300ms, 1s, 20ms);
  EXPECT_FALSE(n.fd.valid());
  EXPECT_EQ(n.error, std::strerror(ECONNREFUSED));
  EXPECT_GE(seconds_since(t1), 0.3);
  EXPECT_LT(seconds_since(t1), 2.0);
}

TEST(Net, AcceptTimesOutAndNamesThePeer) {
  Fd l = listen_tcp("127.0.0.1", 0);
  const auto t0 = Clock::now();
  Accepted none = accept_until(l.get(), t0 + 200ms);
  EXPECT_FALSE(none.fd.valid());
  EXPECT_EQ(none.error, "timed out");
  EXPECT_TRUE(none.timed_out);
  EXPECT_GE(seconds_since(t0), 0.2);
  ConnectResult c = try_connect("127.0.0.1", local_port(l.get()), Clock::now() + 2s);
  ASSERT_TRUE(c.fd.valid()) << c.error;
  Accepted a = accept_until(l.get(), Clock::now() + 2s, /*nonblocking=*/true);
  ASSERT_TRUE(a.fd.valid()) << a.error;
  sockaddr_in me{};
  socklen_t len = sizeof(me);
  ::getsockname(c.fd.get(), reinterpret_cast<sockaddr*>(&me), &len);
  EXPECT_EQ(a.peer, "127.0.0.1:" + std::to_string(ntohs(me.sin_port)));
  EXPECT_EQ(peer_address(a.fd.get()), a.peer);
  EXPECT_EQ(peer_address(l.get()), "?");
}

TEST(Net, ListenOnAPortInUseNamesTheAddress) {
  Fd l = listen_tcp("127.0.0.1", 0);
  const int port = local_port(l.get());
  try {
    listen_tcp("127.0.0.1", port);
    FAIL() << "listened twice on one port";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot listen on 127.0.0.1:" + std::to_string(port)), std::string::npos)
        << e.what();
  }
}

TEST(Net, SecondsText) {
  EXPECT_EQ(seconds_text(5000ms), "5 s");
  EXPECT_EQ(seconds_text(250ms), "0.25 s");
}

}  // namespace
}  // namespace geoloco::net

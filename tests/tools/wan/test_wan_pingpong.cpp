// Ping-pong over loopback (no namespaces needed): RTT summary statistics, wire checks and the
// failure paths (no server, bad input) -- all bounded in time.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <nlohmann/json.hpp>
#include <thread>

#include "tests/support/ports.hpp"
#include "tools/wan/pingpong.hpp"
#include "transport/probe/probe_result.hpp"
#include "core/error.hpp"

namespace geoloco::wan {
namespace {

using geoloco::test::fresh_port;

TEST(WanPingpong, PercentileIsNearestRank) {
  const std::vector<double> v = {5, 1, 4, 2, 3};
  EXPECT_EQ(geoloco::probe::percentile(v, 0.5), 3);
  EXPECT_EQ(geoloco::probe::percentile(v, 0.0), 1);
  EXPECT_EQ(geoloco::probe::percentile(v, 0.99), 5);
  EXPECT_EQ(geoloco::probe::percentile(v, 0.2), 1);
  EXPECT_EQ(geoloco::probe::percentile(v, 0.21), 2);
  const RttSummary s = summarize({4, 1, 3, 2});
  EXPECT_EQ(s.min_ms, 1);
  EXPECT_EQ(s.max_ms, 4);
  EXPECT_EQ(s.median_ms, 2);
  EXPECT_DOUBLE_EQ(s.mean_ms, 2.5);
  EXPECT_EQ(s.p99_ms, 4);
  const auto j = nlohmann::json::parse(s.to_json());
  EXPECT_EQ(j["format"], "geoloco-wan-pingpong");
  EXPECT_EQ(j["count"], 4);
  EXPECT_EQ(j["rtt_ms"]["median"], 2.0);
}

TEST(WanPingpong, LoopbackRoundTrips) {
  const std::string ep = "127.0.0.1:" + std::to_string(fresh_port());
  PingpongServerOptions so;
  so.listen = ep;
  so.connections = 1;
  so.timeout_s = 10;
  auto server = std::async(std::launch::async, [so] { run_pingpong_server(so); });
  PingpongClientOptions co;
  co.connect = ep;
  co.count = 100;
  co.warmup = 3;
  co.size = 1000;
  const RttSummary s = run_pingpong_client(co);
  ASSERT_EQ(s.rtt_ms.size(), 100u);
  EXPECT_GT(s.min_ms, 0.0);
  EXPECT_LE(s.min_ms, s.median_ms);
  EXPECT_LE(s.median_ms, s.p99_ms);
  EXPECT_LE(s.p99_ms, s.max_ms);
  EXPECT_LT(s.median_ms, 5.0);  // loopback: tens of microseconds; 5 ms only guards a busy CI box
  server.get();                 // the server exits after its one client and rethrows errors
}

TEST(WanPingpong, NoServerFailsWithinConnectTimeout) {
  PingpongClientOptions co;
  co.connect = "127.0.0.1:" + std::to_string(fresh_port());
  co.connect_timeout_s = 0.5;
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(run_pingpong_client(co), Error);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
}

TEST(WanPingpong, ServerRejectsGarbageAndTimesOutWhenIdle) {
  const int port = fresh_port();
  PingpongServerOptions so;
  so.listen = "127.0.0.1:" + std::to_string(port);
  so.timeout_s = 2;
  auto server = std::async(std::launch::async, [so] { run_pingpong_server(so); });
  int fd = -1;
  for (int i = 0; i < 100; ++i) {  // wait (bounded) for the listener
    fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) break;
    close(fd);
    fd = -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_GE(fd, 0);
  const char junk[24] = "not a ping-pong message";
  ASSERT_EQ(send(fd, junk, sizeof junk, 0), 24);
  try {
    server.get();
    ADD_FAILURE() << "server accepted a bad magic";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad magic"), std::string::npos) << e.what();
  }
  close(fd);

  // Nobody connects: the server gives up after its idle timeout instead of hanging.
  so.listen = "127.0.0.1:" + std::to_string(fresh_port());
  so.timeout_s = 0.3;
  EXPECT_THROW(run_pingpong_server(so), Error);
}

TEST(WanPingpong, RejectsBadOptions) {
  PingpongClientOptions co;
  co.connect = "127.0.0.1";
  EXPECT_THROW(run_pingpong_client(co), InputError);
  co.connect = "nonsense:80";
  EXPECT_THROW(run_pingpong_client(co), InputError);
  co.connect = "127.0.0.1:99999";
  EXPECT_THROW(run_pingpong_client(co), InputError);
  co.connect = "127.0.0.1:7";
  co.size = 8;
  EXPECT_THROW(run_pingpong_client(co), InputError);
}

}  // namespace
}  // namespace geoloco::wan

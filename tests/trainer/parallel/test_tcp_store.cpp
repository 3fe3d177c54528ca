#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "tests/trainer/parallel/test_util.hpp"
#include "trainer/parallel/errors.hpp"
#include "core/net.hpp"
#include "trainer/parallel/store_protocol.hpp"
#include "trainer/parallel/tcp_store.hpp"

namespace geoloco::parallel {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

StoreClientOptions client_opts(int port, std::chrono::milliseconds timeout = 5s) {
  StoreClientOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.site = "paris";
  o.timeout = timeout;
  return o;
}

std::vector<char> bytes(const std::string& s) { return {s.begin(), s.end()}; }

TEST(TcpStore, SetGetCheckAdd) {
  TcpStoreServer server("127.0.0.1", 0);
  TcpStore a(client_opts(server.port()), Clock::now() + 2s);
  TcpStore b(client_opts(server.port()), Clock::now() + 2s);
  a.set("k1", bytes("hello"));
  EXPECT_EQ(b.get("k1"), bytes("hello"));
  EXPECT_FALSE(b.try_get("nope").has_value());
  a.set("empty", {});
  EXPECT_EQ(b.get("empty"), std::vector<char>{});
  EXPECT_EQ(b.check({"k1", "nope", "empty"}), (std::vector<bool>{true, false, true}));
  EXPECT_EQ(a.add("ctr", 5), 5);
  EXPECT_EQ(b.add("ctr", -2), 3);
  // Overwrite is last-writer-wins.
  b.set("k1", bytes("bye"));
  EXPECT_EQ(a.get("k1"), bytes("bye"));
  // A value at the size limit goes through; one byte more is refused before sending.
  std::vector<char> big(store_wire::kMaxValueBytes, 'x');
  a.set("big", big);
  EXPECT_EQ(b.get("big").size(), big.size());
  big.push_back('y');
  EXPECT_THROW(a.set("big2", big), StoreError);
  EXPECT_THROW(a.set(std::string(store_wire::kMaxKeyBytes + 1, 'k'), {}), StoreError);
}

TEST(TcpStore, ManyConcurrentClientsCountExactly) {
  // 32 clients each add 1 to one counter 50 times and publish a key; the server serialises
  // them, so the counter ends at exactly 32 * 50 and every key is visible to everyone.
  TcpStoreServer server("127.0.0.1", 0);
  const int kClients = 32, kAdds = 50;
  test::run_ranks(kClients, [&](int i) {
    TcpStore c(client_opts(server.port()), Clock::now() + 5s);
    for (int k = 0; k < kAdds; ++k) c.add("counter", 1);
    c.set(fmt::format("client/{}", i), bytes(std::to_string(i)));
    std::vector<std::string> keys;
    for (int j = 0; j < kClients; ++j) keys.push_back(fmt::format("client/{}", j));
    c.wait(keys, 10s);
    EXPECT_EQ(c.get(fmt::format("client/{}", (i + 1) % kClients)), bytes(std::to_string((i + 1) % kClients)));
  });
  TcpStore c(client_opts(server.port()), Clock::now() + 2s);
  EXPECT_EQ(c.add("counter", 0), kClients * kAdds);
  c.wait({}, 1ms);  // nothing to wait for: returns at once
}

TEST(TcpStore, WaitReturnsWhenAnotherClientSets) {
  TcpStoreServer server("127.0.0.1", 0);
  TcpStore a(client_opts(server.port()), Clock::now() + 2s);
  std::thread setter([&] {
    TcpStore b(client_opts(server.port()), Clock::now() + 2s);
    std::this_thread::sleep_for(100ms);
    b.set("late", bytes("v"));
  });
  auto t0 = Clock::now();
  a.wait({"late"}, 5s);
  setter.join();
  EXPECT_LT(Clock::now() - t0, 3s);
  EXPECT_EQ(a.get("late"), bytes("v"));
}

TEST(TcpStore, WaitTimesOutNamingTheMissingKeys) {
  TcpStoreServer server("127.0.0.1", 0);
  TcpStore a(client_opts(server.port()), Clock::now() + 2s);
  a.set("here", bytes("1"));
  auto t0 = Clock::now();
  try {
    a.wait({"here", "gone1", "gone2"}, 300ms);
    FAIL() << "wait should have timed out";
  } catch (const StoreError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("gone1, gone2"), std::string::npos) << m;
    EXPECT_EQ(m.find("here"), std::string::npos) << m;
    EXPECT_NE(m.find("paris"), std::string::npos) << m;
  }
  auto dt = Clock::now() - t0;
  EXPECT_GE(dt, 300ms);
  EXPECT_LT(dt, 2s);
}

TEST(TcpStore, ClientRetriesUntilServerStarts) {
  const int port = test::fresh_port();
  std::unique_ptr<TcpStoreServer> server;
  std::thread starter([&] {
    std::this_thread::sleep_for(300ms);
    server = std::make_unique<TcpStoreServer>("127.0.0.1", port);
  });
  TcpStore c(client_opts(port), Clock::now() + 5s);
  starter.join();
  c.set("x", bytes("y"));
  EXPECT_EQ(c.get("x"), bytes("y"));
}

TEST(TcpStore, ConnectGivesUpAtTheDeadline) {
  const int port = test::fresh_port();
  auto t0 = Clock::now();
  try {
    TcpStore c(client_opts(port), Clock::now() + 400ms);
    FAIL() << "connected to nothing";
  } catch (const StoreError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find(fmt::format("127.0.0.1:{}", port)), std::string::npos) << m;
    EXPECT_NE(m.find("refused"), std::string::npos) << m;
  }
  EXPECT_LT(Clock::now() - t0, 2s);
}

// Sends raw bytes on a fresh connection; returns what the server answered before closing.
std::vector<uint8_t> send_raw(int port, const std::vector<uint8_t>& raw) {
  auto r = net::try_connect("127.0.0.1", port, Clock::now() + 2s);
  EXPECT_TRUE(r.fd.valid()) << r.error;
  EXPECT_TRUE(net::send_all(r.fd.get(), raw.data(), raw.size(), Clock::now() + 2s).ok());
  std::vector<uint8_t> got;
  uint8_t buf[4096];
  for (;;) {
    const net::IoResult io = net::recv_all(r.fd.get(), buf, 1, Clock::now() + 2s);
    if (!io.ok()) {
      EXPECT_EQ(io.message(), "connection closed by peer");  // the server closed it, no hang
      break;
    }
    got.push_back(buf[0]);
  }
  return got;
}

TEST(TcpStore, MalformedInputIsDroppedAndServerKeepsServing) {
  TcpStoreServer server("127.0.0.1", 0);
  TcpStore good(client_opts(server.port()), Clock::now() + 2s);
  good.set("k", bytes("v"));

  // 1. Garbage that is not our protocol: closed without a reply.
  std::vector<uint8_t> garbage(64);
  for (size_t i = 0; i < garbage.size(); ++i) garbage[i] = static_cast<uint8_t>(i * 37 + 11);
  EXPECT_TRUE(send_raw(server.port(), garbage).empty());

  // 2. Our magic, wrong version: closed without a reply.
  auto h = store_wire::encode_header(store_wire::Type::kGet, 0);
  h[4] = 99;
  EXPECT_TRUE(send_raw(server.port(), {h.begin(), h.end()}).empty());

  // 3. A header announcing a payload over the limit: refused before buffering it.
  auto big = store_wire::encode_header(store_wire::Type::kSet, 0xFFFFFFF0u);
  EXPECT_TRUE(send_raw(server.port(), {big.begin(), big.end()}).empty());

  // 4. A valid header whose payload lies about the key length: an ERROR reply, then close.
  std::vector<uint8_t> payload = {0xFF, 0xFF, 0x00, 0x00, 'a', 'b'};  // key length 65535, 2 bytes present
  auto h2 = store_wire::encode_header(store_wire::Type::kGet, static_cast<uint32_t>(payload.size()));
  std::vector<uint8_t> frame(h2.begin(), h2.end());
  frame.insert(frame.end(), payload.begin(), payload.end());
  auto reply = send_raw(server.port(), frame);
  ASSERT_GE(reply.size(), store_wire::kHeaderBytes);
  store_wire::Header rh;
  ASSERT_EQ(store_wire::decode_header(std::span<const uint8_t, store_wire::kHeaderBytes>(reply.data(), 16), &rh), "");
  EXPECT_EQ(rh.type, store_wire::Type::kError);

  // 5. A reply type sent as a request.
  auto h3 = store_wire::encode_header(store_wire::Type::kOk, 0);
  auto reply3 = send_raw(server.port(), {h3.begin(), h3.end()});
  ASSERT_GE(reply3.size(), store_wire::kHeaderBytes);

  // 6. Connect and close without sending anything.
  { auto r = net::try_connect("127.0.0.1", server.port(), Clock::now() + 2s); }

  EXPECT_EQ(server.rejected_connections(), 5u);
  // The well-behaved client is unaffected.
  EXPECT_EQ(good.get("k"), bytes("v"));
  TcpStore fresh(client_opts(server.port()), Clock::now() + 2s);
  EXPECT_EQ(fresh.get("k"), bytes("v"));
}

TEST(StoreWire, DecodeRejectsTruncationAndTrailingBytes) {
  store_wire::Message m;
  m.type = store_wire::Type::kSet;
  m.key = "key";
  m.value = bytes("value");
  auto frame = store_wire::encode(m);
  std::span<const uint8_t> payload(frame.data() + store_wire::kHeaderBytes, frame.size() - store_wire::kHeaderBytes);
  auto back = store_wire::decode(store_wire::Type::kSet, payload);
  EXPECT_EQ(back.key, "key");
  EXPECT_EQ(back.value, bytes("value"));
  for (size_t cut = 0; cut < payload.size(); ++cut)
    EXPECT_THROW(store_wire::decode(store_wire::Type::kSet, payload.first(cut)), StoreError) << cut;
  std::vector<uint8_t> longer(payload.begin(), payload.end());
  longer.push_back(0);
  EXPECT_THROW(store_wire::decode(store_wire::Type::kSet, longer), StoreError);
  EXPECT_THROW(store_wire::decode(static_cast<store_wire::Type>(0x7777), {}), StoreError);
}

TEST(TcpStore, LostServerIsAnErrorNotAHang) {
  auto server = std::make_unique<TcpStoreServer>("127.0.0.1", 0);
  TcpStore c(client_opts(server->port(), 1s), Clock::now() + 2s);
  c.set("a", bytes("b"));
  server.reset();
  auto t0 = Clock::now();
  EXPECT_THROW(c.get("a"), StoreError);
  EXPECT_LT(Clock::now() - t0, 3s);
}

}  // namespace
}  // namespace geoloco::parallel

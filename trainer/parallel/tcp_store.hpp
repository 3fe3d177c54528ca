// Rendezvous key-value store over TCP: rank 0 of a site runs a TcpStoreServer on the
// (host, port) from the config; every rank, rank 0 included, talks to it through a
// TcpStore client. TcpStore implements gloo::rendezvous::Store so
// gloo::rendezvous::Context::connectFullMesh can use it directly; the NCCL backend uses it
// to pass the ncclUniqueId. Wire format: store_protocol.hpp.
//
// Timeouts everywhere: the client retries connecting until its deadline (rank 0 may start
// after the others), and each request, each wait and each get is bounded.
#pragma once

#include <gloo/rendezvous/store.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/net.hpp"

namespace geoloco::parallel {

// Serves the store on one thread (poll loop). Binds in the constructor, so "address in use"
// surfaces to the caller at once; the destructor stops the thread and closes every socket.
class TcpStoreServer {
 public:
  // port 0 picks a free port (see port()).
  TcpStoreServer(const std::string& host, int port);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  int port() const { return port_; }
  const std::string& host() const { return host_; }
  // Connections dropped because they sent something that is not our protocol or a
  // malformed request (observability and tests).
  uint64_t rejected_connections() const { return rejected_.load(); }
  uint64_t requests_served() const { return served_.load(); }

 private:
  void run();

  std::string host_;
  int port_ = 0;
  Fd listen_fd_;
  Fd wake_read_, wake_write_;
  std::atomic<uint64_t> rejected_{0};
  std::atomic<uint64_t> served_{0};
  std::thread thread_;
};

struct StoreClientOptions {
  std::string host = "127.0.0.1";
  int port = 0;
  // Names the site in error messages ("site paris: ...").
  std::string site = "site";
  // Bound for each request and the default bound for wait()/get().
  std::chrono::milliseconds timeout{30000};
};

class TcpStore : public gloo::rendezvous::Store {
 public:
  using Clock = std::chrono::steady_clock;

  // Connects, retrying every ~50 ms until connect_deadline. Throws StoreError naming the
  // address and the last connect error when the server never answers.
  TcpStore(StoreClientOptions opts, Clock::time_point connect_deadline);

  void set(const std::string& key, const std::vector<char>& data) override;
  // Waits up to the default timeout for the key, then returns its value.
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  // Polls until every key exists; throws StoreError naming the missing keys on timeout.
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

  // One round trip: which keys exist now.
  std::vector<bool> check(const std::vector<std::string>& keys);
  // One round trip: the value, or nullopt when the key is absent.
  std::optional<std::vector<char>> try_get(const std::string& key);
  // Atomically adds delta to the 64-bit counter stored at key (absent = 0); returns the new value.
  int64_t add(const std::string& key, int64_t delta);

  const StoreClientOptions& options() const { return opts_; }

 private:
  std::vector<uint8_t> round_trip(const std::vector<uint8_t>& frame, const char* what, uint16_t* type);

  StoreClientOptions opts_;
  std::mutex mu_;
  Fd fd_;
};

}  // namespace geoloco::parallel

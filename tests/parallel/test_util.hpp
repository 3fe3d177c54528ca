// Helpers shared by the parallel tests: free ports, running N ranks as threads.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <exception>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "trainer/parallel/rendezvous.hpp"

namespace geoloco::parallel::testing {

// A port the kernel just handed out on 127.0.0.1 (closed again: tiny race, fine for tests).
inline int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) throw std::runtime_error("bind");
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

inline RendezvousOptions options(const std::string& site, int rank, int size, int port,
                                 std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  RendezvousOptions o;
  o.site = site;
  o.rank = rank;
  o.size = size;
  o.store_host = "127.0.0.1";
  o.store_port = port;
  o.bind_address = "127.0.0.1";
  o.timeout = timeout;
  return o;
}

// Runs fn(rank) on `size` threads; rethrows the first exception after joining all.
inline void run_ranks(int size, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  std::mutex mu;
  std::exception_ptr first;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        std::lock_guard lock(mu);
        if (!first) first = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

}  // namespace geoloco::parallel::testing

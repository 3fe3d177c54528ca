// Helpers shared by the parallel tests: rendezvous options on loopback. Ports and rank
// threads come from tests/support (included here for every parallel test).
#pragma once

#include <chrono>
#include <string>

#include "tests/support/ports.hpp"
#include "tests/support/threads.hpp"
#include "trainer/parallel/rendezvous.hpp"

namespace geoloco::parallel::testing {

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

}  // namespace geoloco::parallel::testing

// Helpers for the probe tests: two connected transports in this process (fixed ports for
// config mode and the CLI: geoloco::test::fresh_port, tests/support/ports.hpp).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <future>
#include <memory>
#include <string>
#include <vector>

#include "tests/support/ports.hpp"
#include "transport/probe/probe.hpp"
#include "transport/ucx/ucx_transport.hpp"

namespace geoloco::probe::test {

inline transport::TransportConfig pair_config(int lanes, transport::EmulateConfig emulate = {}) {
  transport::TransportConfig c;
  const std::string key = "probe-test-key-0123456789";
  c.psk.assign(key.begin(), key.end());
  c.connect_timeout_s = 10;
  c.handshake_timeout_s = 5;
  c.transfer_timeout_s = 30;
  c.lanes = lanes;
  c.chunk_bytes = 1 << 20;
  c.inflight_chunks = 32;
  c.emulate = emulate;
  return c;
}

// Sites "a" (dials) and "b" on 127.0.0.1, kernel-picked ports.
struct Pair {
  std::unique_ptr<transport::ucx::UcxTransport> a, b;
  explicit Pair(const transport::TransportConfig& c) {
    a = std::make_unique<transport::ucx::UcxTransport>(c, transport::Identity{"a", 0, "probe-test", 7});
    b = std::make_unique<transport::ucx::UcxTransport>(c, transport::Identity{"b", 0, "probe-test", 7});
    int pa = a->listen("127.0.0.1", 0);
    int pb = b->listen("127.0.0.1", 0);
    auto fa = std::async(std::launch::async, [&] { a->connect({{"b", 0, "127.0.0.1", pb}}); });
    b->connect({{"a", 0, "127.0.0.1", pa}});
    fa.get();
  }
};

}  // namespace geoloco::probe::test

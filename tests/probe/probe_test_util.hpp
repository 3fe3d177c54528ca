// Helpers for the probe tests: two connected transports in this process, fixed test ports.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <future>
#include <memory>
#include <string>
#include <vector>

#include "tools/probe/probe.hpp"
#include "transport/transport.hpp"

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
  std::unique_ptr<transport::Transport> a, b;
  explicit Pair(const transport::TransportConfig& c) {
    a = std::make_unique<transport::Transport>(c, transport::Identity{"a", 0, "probe-test", 7});
    b = std::make_unique<transport::Transport>(c, transport::Identity{"b", 0, "probe-test", 7});
    int pa = a->listen("127.0.0.1", 0);
    int pb = b->listen("127.0.0.1", 0);
    auto fa = std::async(std::launch::async, [&] { a->connect({{"b", 0, "127.0.0.1", pb}}); });
    b->connect({{"a", 0, "127.0.0.1", pa}});
    fa.get();
  }
};

// Ports for tests that need fixed ones (config mode, the CLI): below the kernel's ephemeral
// range (32768+) and apart from the other tests' ranges (20000-31000): 14000-19999.
inline int probe_test_port() {
  static int n = 0;
  return 14000 + (static_cast<int>(getpid()) * 7) % 4000 + 20 * (n++ % 100);
}

}  // namespace geoloco::probe::test

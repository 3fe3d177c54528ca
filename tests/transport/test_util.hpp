// Helpers shared by the transport tests: configs, in-process clusters, payload patterns.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "transport/transport.hpp"

namespace geoloco::transport::test {

inline std::vector<uint8_t> key_bytes(const std::string& s) { return {s.begin(), s.end()}; }

inline TransportConfig small_config(int lanes = 1, uint64_t chunk = 64 * 1024) {
  TransportConfig c;
  c.psk = key_bytes("geoloco-test-key-0123456789");
  c.connect_timeout_s = 5;
  c.handshake_timeout_s = 2;
  c.transfer_timeout_s = 5;
  c.lanes = lanes;
  c.chunk_bytes = chunk;
  c.inflight_chunks = 8;
  return c;
}

inline Identity ident(const std::string& site, int rank = 0) { return Identity{site, rank, "run-1", 0xC0FFEEull}; }

// Payload whose every byte depends on (seed, index), so misplaced chunks are caught.
inline std::vector<uint8_t> pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  uint32_t x = seed * 2654435761u + 12345u;
  for (size_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    v[i] = static_cast<uint8_t>(x >> 24);
  }
  return v;
}

// N transports in this process, all listening on 127.0.0.1 with ports picked by the kernel.
struct Cluster {
  std::vector<std::unique_ptr<Transport>> t;
  std::vector<PeerInfo> infos;

  Cluster(const std::vector<TransportConfig>& cfgs, const std::vector<Identity>& ids,
          const std::vector<TestHooks>& hooks = {}) {
    for (size_t i = 0; i < cfgs.size(); ++i) {
      t.push_back(std::make_unique<Transport>(cfgs[i], ids[i], i < hooks.size() ? hooks[i] : TestHooks{}));
      int port = t.back()->listen("127.0.0.1", 0);
      infos.push_back(PeerInfo{ids[i].site, ids[i].rank, "127.0.0.1", port});
    }
  }
  std::vector<PeerInfo> peers_of(size_t i) const {
    std::vector<PeerInfo> out;
    for (size_t j = 0; j < infos.size(); ++j)
      if (j != i) out.push_back(infos[j]);
    return out;
  }
  // connect() everywhere in parallel; returns each one's error message ("" on success).
  std::vector<std::string> connect_all() {
    std::vector<std::future<std::string>> f;
    for (size_t i = 0; i < t.size(); ++i)
      f.push_back(std::async(std::launch::async, [this, i]() -> std::string {
        try {
          t[i]->connect(peers_of(i));
          return "";
        } catch (const std::exception& e) {
          return std::string("!") + e.what();
        }
      }));
    std::vector<std::string> out;
    for (auto& x : f) out.push_back(x.get());
    return out;
  }
};

}  // namespace geoloco::transport::test

// Helpers shared by the transport tests: configs, payload patterns, frame encoding.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <future>
#include <string>
#include <vector>

#include "transport/transport.hpp"

namespace geoloco::transport::test {

using Clock = std::chrono::steady_clock;

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

inline Payload P(const std::vector<uint8_t>& v) { return make_payload(v); }

inline std::vector<uint8_t> encoded(const FrameHeader& h) {
  std::vector<uint8_t> out(kFrameHeaderBytes);
  h.encode(out.data());
  return out;
}

inline double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

inline bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// The error of a handle that failed: "<Type>: message" ("" if it succeeded within 20 s,
// "hang" if it did not complete).
inline std::string error_of(const OpHandle& h, double limit_s = 20) {
  try {
    return h.wait_for(std::chrono::duration<double>(limit_s)) ? "" : "hang";
  } catch (const CancelledError& e) {
    return std::string("CancelledError: ") + e.what();
  } catch (const FrameError& e) {
    return std::string("FrameError: ") + e.what();
  } catch (const TimeoutError& e) {
    return std::string("TimeoutError: ") + e.what();
  } catch (const HandshakeError& e) {
    return std::string("HandshakeError: ") + e.what();
  } catch (const TransportError& e) {
    return std::string("TransportError: ") + e.what();
  }
}

// What both test clusters (memory_cluster.hpp, ucx_cluster.hpp) do the same way: `Derived` has
// `t` (transports), `infos` (their PeerInfo) and `connect(i)`.
template <class Derived>
struct ClusterOps {
  std::vector<PeerInfo> peers_of(size_t i) const {
    const auto& infos = static_cast<const Derived&>(*this).infos;
    std::vector<PeerInfo> out;
    for (size_t j = 0; j < infos.size(); ++j)
      if (j != i) out.push_back(infos[j]);
    return out;
  }
  // connect() everywhere in parallel; each one's error ("" on success, "!message" else).
  std::vector<std::string> connect_all() {
    auto& self = static_cast<Derived&>(*this);
    std::vector<std::future<std::string>> f;
    for (size_t i = 0; i < self.t.size(); ++i)
      f.push_back(std::async(std::launch::async, [&self, i]() -> std::string {
        try {
          self.connect(i);
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

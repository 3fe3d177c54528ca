// TransportConfig: the `transport:` section of a run config.
//
//   transport:
//     psk_file: keys/run.psk     # relative to the config file's directory; >= 16 bytes
//     timeout_s: 30              # default for the three below
//     connect_timeout_s: 60      # all peers connected and authenticated
//     handshake_timeout_s: 10    # one connection's handshake
//     transfer_timeout_s: 120    # a send/recv making no progress for this long fails
//     lanes: 1                   # endpoints (TCP connections) per peer pair
//     chunk_bytes: 4194304       # frame payload size; peers must agree
//     inflight_chunks: 8         # chunks in flight per peer (pipelining window)
//     eager_bytes: 8388608       # messages up to this size are sent without rendezvous
//     max_message_bytes: 17179869184   # largest transfer a peer may announce
//     emulate: {delay_ms: 0, rate_mbit: 0}  # test hook: sender-side delay and pacing
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/config_node.hpp"

namespace geoloco::transport {

inline constexpr size_t kMinPskBytes = 16;
inline constexpr size_t kMaxPskBytes = 4096;
inline constexpr uint64_t kMaxEagerBytes = 64ull << 20;

struct EmulateConfig {
  double delay_ms = 0;   // one-way delay added to every cross-site chunk
  double rate_mbit = 0;  // per peer-pair rate cap (Mbit/s = 1e6 bit/s); 0 = none
  bool enabled() const { return delay_ms > 0 || rate_mbit > 0; }
};

struct TransportConfig {
  std::string psk_file;  // resolved path (for messages); the key is in `psk`
  std::vector<uint8_t> psk;
  double connect_timeout_s = 60;
  double handshake_timeout_s = 10;
  double transfer_timeout_s = 120;
  int lanes = 1;
  uint64_t chunk_bytes = 4ull << 20;
  int inflight_chunks = 8;
  // Messages of at most eager_bytes are sent eagerly (UCP_AM_SEND_FLAG_EAGER on every chunk)
  // while the peer's eager window (4 x eager_bytes not yet credited back by the receiver) has
  // room: the receiver has them half a round trip after they leave instead of after the
  // rendezvous handshake (~2 round trips over TCP), and never parks more than the window for
  // a peer that runs ahead. Longer messages, a full window, or everything with 0: UCX decides
  // each chunk (rendezvous above its threshold).
  uint64_t eager_bytes = 8ull << 20;
  uint64_t max_message_bytes = 16ull << 30;
  EmulateConfig emulate;

  // Parses and validates the section; reads the key file (FileError when missing,
  // unreadable, shorter than kMinPskBytes or longer than kMaxPskBytes).
  static TransportConfig from_yaml(const config::Node& node, const std::string& config_dir);
  // Range checks shared with programmatic construction (tests, benchmarks).
  void validate() const;
};

// Reads a key file: the raw bytes, with one trailing newline stripped so `echo key > f` works.
std::vector<uint8_t> read_psk_file(const std::string& path);

}  // namespace geoloco::transport

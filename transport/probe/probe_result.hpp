// What one probe between two endpoints measured, its JSON form, and its wire form (the
// initiator sends it to the responder at the end, so both sides return the same numbers;
// config mode shares every pair's result with every site).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "transport/probe/probe_wire.hpp"

namespace geoloco::probe {

struct RttStats {
  uint32_t count = 0;  // pings counted (after warmup)
  double min_ms = 0, median_ms = 0, mean_ms = 0, p99_ms = 0, max_ms = 0;
  // The statistics of a non-empty sample of round trips, in ms.
  static RttStats of(const std::vector<double>& rtt_ms);
};

// Nearest-rank percentile of a non-empty sample (q in [0, 1]): the smallest value with at
// least q of the sample at or below it.
double percentile(std::vector<double> v, double q);

// TCP segment counters of the sender's network namespace over a stream (/proc/net/snmp).
struct Retransmits {
  uint64_t retrans_segs = 0;  // Tcp RetransSegs delta
  uint64_t out_segs = 0;      // Tcp OutSegs delta (excludes retransmitted segments)
  double pct() const;         // 100 x retrans / (out + retrans)
};

struct StreamResult {
  int connections = 0;  // TCP connections (transport lanes) that carried the stream
  int lane = -1;        // the lane used, -1: all of them
  uint64_t message_bytes = 0;
  uint32_t window = 0;
  StreamReport receiver;                   // as measured where the bytes arrived
  double gbps = 0;                         // receiver: counted_bytes x 8 / counted_s / 1e9 (the figure to use)
  double sender_s = 0;                     // sender: first send to last data send completion
  double sender_gbps = 0;                  // sender: bytes / sender_s (includes the omitted start)
  std::optional<Retransmits> retransmits;  // nullopt where /proc/net/snmp is unreadable
};

struct ProbeResult {
  std::string initiator;  // site names; the initiator sends the streams
  std::string responder;
  int lanes = 0;  // the transport's lanes between them
  RttStats rtt;
  std::optional<StreamResult> single;  // lane 0 only: one connection
  std::optional<StreamResult> multi;   // all lanes (absent with one lane: `single` is that)
};

// Receiver-side throughput of a report, Gbit/s (0 when nothing was counted).
double report_gbps(const StreamReport& r);

// Whether the probe's own pipeline (window x message_bytes in flight) may have limited the
// figure: less than twice the bandwidth-delay product it measured.
bool pipeline_limited(const StreamResult& s, double rtt_ms);

nlohmann::json to_json(const RttStats& r);
nlohmann::json to_json(const StreamResult& s);
nlohmann::json to_json(const ProbeResult& r);

// kResult / kShare messages: header, u32 count (<= kMaxResults), then each result.
inline constexpr size_t kMaxResults = 256;
std::vector<uint8_t> encode_results(const Header& h, const std::vector<ProbeResult>& results);
std::optional<std::vector<ProbeResult>> decode_results(std::span<const uint8_t> body, std::string& error);

}  // namespace geoloco::probe

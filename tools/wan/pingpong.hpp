// Application-level TCP ping-pong: the RTT a training process actually sees. `ping` cannot
// be used here because ICMP timestamps are taken before the receive-side delay line.
// Wire message (little endian, `size` bytes, >= 24): u32 magic 'GLPP', u16 version 1,
// u16 reserved, u64 sequence number, u64 size, then padding. The server echoes it verbatim;
// the client checks magic, version, sequence and size of every echo.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace geoloco::wan {

struct PingpongServerOptions {
  std::string listen = "0.0.0.0:7300";  // addr:port
  int connections = 1;                  // serve this many clients, then exit (0 = forever)
  double timeout_s = 60.0;              // give up when idle this long (never hang a script)
  std::string ready_file;               // created once listening
};

struct PingpongClientOptions {
  std::string connect;  // addr:port
  int count = 200;
  int warmup = 10;  // not counted (first-RTT effects: slow start, caches)
  uint32_t size = 64;
  double interval_ms = 0.0;         // pause between pings
  double connect_timeout_s = 10.0;  // retries while the server comes up
  double timeout_s = 30.0;          // per-echo deadline
};

struct RttSummary {
  std::vector<double> rtt_ms;  // per counted ping, in send order
  double min_ms = 0, median_ms = 0, mean_ms = 0, p99_ms = 0, max_ms = 0;
  std::string to_json() const;
};

// The sample's statistics (probe::RttStats::of) with the sample kept.
RttSummary summarize(std::vector<double> rtt_ms);

void run_pingpong_server(const PingpongServerOptions& opt);
RttSummary run_pingpong_client(const PingpongClientOptions& opt);

}  // namespace geoloco::wan

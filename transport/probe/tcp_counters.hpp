// TCP segment counters of this process's network namespace, from /proc/net/snmp:
//
//   Tcp: RtoAlgorithm RtoMin ... InSegs OutSegs RetransSegs InErrs OutRsts InCsumErrors
//   Tcp: 1 200 ... 123 456 7 0 0 0
//
// They count every TCP socket of the namespace (not only ours) since boot, so a probe takes
// the difference across its own transfer and says so. OutSegs excludes retransmitted segments.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace geoloco::probe {

struct TcpCounters {
  uint64_t out_segs = 0;
  uint64_t retrans_segs = 0;
};

// Parses the text of /proc/net/snmp; nullopt when the Tcp lines or either column is missing
// or malformed (no guessing).
std::optional<TcpCounters> parse_snmp(const std::string& text);
// Reads and parses the file; nullopt when it cannot be read (not Linux, no procfs).
std::optional<TcpCounters> read_tcp_counters(const std::string& path = "/proc/net/snmp");

}  // namespace geoloco::probe

// Standalone probe runs: build a Transport, connect, run probe_peer, collect the results.
//
//   iperf-like:   run_listen({"0.0.0.0", 7000}, o)      (responder, serves one initiator)
//                 run_connect({"198.18.1.2", 7000}, o)   (initiator)
//   run config:   run_sites(spec, "paris", o)            (every site runs it; for each pair of
//                 sites the lower index initiates; at the end every site holds every pair)
//
// Errors (exit codes of `geoloco probe`): InputError (2) for bad options or addresses;
// ProbeError / transport errors (1) when a peer never shows up within `timeout_s`, is
// refused, dies or breaks the protocol -- each message names the peer and its address.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "transport/probe/probe.hpp"
#include "transport/transport_config.hpp"

namespace geoloco::probe {

struct Endpoint {
  std::string host;  // IPv4 literal (names are resolved when parsed)
  int port = 0;
  std::string str() const;
};
// "ADDR:PORT" with ADDR an IPv4 address or a name resolving to one; InputError naming `flag`.
Endpoint parse_endpoint(const std::string& text, const std::string& flag, bool allow_port_zero = false);
// The local address the kernel would use to reach `peer_host` (a UDP route lookup; nothing is
// sent). Error when there is no route.
std::string local_address_towards(const std::string& peer_host);

struct RunnerOptions {
  ProbeOptions probe;
  int connections = 4;                // transport lanes between the two sides (both must agree)
  double timeout_s = 30;              // the peer must be connected within this
  std::string psk_file;               // standalone modes; empty: the public default key (no authentication)
  uint64_t chunk_bytes = 4ull << 20;  // standalone transport chunk size
  std::optional<transport::EmulateConfig> emulate;  // standalone test hook (transport.emulate)
  void validate() const;                            // InputError
};

// The standalone modes' fixed identities: the initiator dials (its site name sorts first).
inline constexpr const char* kInitiatorSite = "client";
inline constexpr const char* kResponderSite = "server";
// Public default key of the standalone modes (documented; gives integrity, not secrecy).
inline constexpr const char* kDefaultProbeKey = "geoloco-probe-public-default-key";

struct SiteSpec {
  std::string name;
  std::string host;
  int port = 0;
};

// One run's outcome, what the reports are made of.
struct ProbeRun {
  std::string mode;                // listen | connect | config
  std::string self;                // this side's site name
  std::string endpoint;            // listen/connect: the address given; config: the config file
  std::vector<std::string> sites;  // every site (config order; 2 in the standalone modes)
  int lanes = 0;
  uint64_t chunk_bytes = 0;
  transport::EmulateConfig emulate;
  std::vector<ProbeResult> pairs;  // config mode: every pair, lexicographic by site index
};

ProbeRun run_listen(const Endpoint& at, const RunnerOptions& o);
ProbeRun run_connect(const Endpoint& peer, const RunnerOptions& o);
// `tc`: the run config's transport section (psk, timeouts, chunking, emulate); its lanes and
// timeouts are adjusted for the probe (connections; timeout_s for connecting).
ProbeRun run_sites(const std::vector<SiteSpec>& sites, const std::string& self, const transport::TransportConfig& tc,
                   const std::string& run_id, const RunnerOptions& o);

}  // namespace geoloco::probe

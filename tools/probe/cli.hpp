// `geoloco probe`, registered by trainer/app:
//   geoloco probe --listen ADDR:PORT              responder (like iperf3 -s; serves one initiator)
//   geoloco probe --connect ADDR:PORT             initiator (like iperf3 -c)
//   geoloco probe CONFIG --site NAME              at every site of a run config
// Prints a table (or --json) on stdout, progress on stderr, and with --out FILE a budget YAML
// for `geoloco budget --from FILE`. InputError (exit 2) for bad flags/config; Error (exit 1)
// when a peer does not show up, is refused, dies or breaks the protocol.
#pragma once

#include <CLI/CLI.hpp>

#include <optional>
#include <ostream>
#include <string>
#include <vector>

namespace geoloco::probe {

void add_probe_command(CLI::App& app);

struct ProbeFlags {
  std::string config;
  std::string site;
  std::vector<std::string> sets;
  std::string listen, connect;
  int connections = 4;
  double seconds = 5;
  bool seconds_given = false;
  std::string bytes;  // a count: 1GiB, 500M
  int count = 50;
  int warmup = 5;
  int ping_bytes = 64;
  std::string message_bytes = "1MiB";
  int window = 16;
  std::optional<double> omit;
  std::optional<double> timeout;  // default: 30 s, or the config's transport.connect_timeout_s
  std::string psk_file;
  std::string out;
  bool json = false;
  bool quiet = false;
  bool verbose = false;
};

// Runs `geoloco probe`: returns what goes to stdout; progress lines go to `notes`.
std::string run_probe(const ProbeFlags& f, std::ostream& notes);

}  // namespace geoloco::probe

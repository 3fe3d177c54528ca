// This host's `nvidia-smi topo -m` text (host_topology.hpp), run through run_capture.
#include "planner/host_topology.hpp"

#include <fmt/format.h>

#include <chrono>
#include <cstring>
#include <utility>

#include "core/error.hpp"
#include "core/subprocess.hpp"

namespace geoloco::planner {

std::string read_nvidia_smi_topo(const HostTopologyOptions& opts) {
  const std::string what = opts.nvidia_smi + " topo -m";
  Captured c;
  try {
    c = run_capture({opts.nvidia_smi, "topo", "-m"},
                    {.timeout = std::chrono::milliseconds(static_cast<int64_t>(opts.timeout_s * 1000))});
  } catch (const SpawnError& e) {
    throw InputError(
        fmt::format("{}: cannot run it: {} (give site.topology.file instead)", what, std::strerror(e.error())));
  } catch (const CaptureError&) {
    throw InputError(fmt::format("{}: no complete answer within {} s", what, opts.timeout_s));
  }
  std::string& errors = c.err;
  while (!errors.empty() && (errors.back() == '\n' || errors.back() == '\r')) errors.pop_back();
  if (c.status.signal != 0) throw InputError(fmt::format("{}: killed by signal {}", what, c.status.signal));
  if (c.status.code != 0)
    throw InputError(fmt::format("{}: exit status {}{}{}", what, c.status.code, errors.empty() ? "" : ": ", errors));
  if (c.out.empty()) throw InputError(fmt::format("{}: printed nothing", what));
  return std::move(c.out);
}

}  // namespace geoloco::planner

// The GPU topology of this host, read from `nvidia-smi topo -m` at start-up: what
// site.strategy: auto acts on when a cuda site gives no topology.file.
//
// The program is HostTopologyOptions::nvidia_smi (the CLI sets it from GEOLOCO_NVIDIA_SMI: a
// wrapper where nvidia-smi is not on PATH; tests give a script printing a fixture), run
// without a shell through geoloco::run_capture, its output read to the end within the
// timeout. Throws InputError naming the command and what went wrong: not found, killed, a
// non-zero exit (with its stderr), no output, or the deadline.
#pragma once

#include <string>

namespace geoloco::planner {

struct HostTopologyOptions {
  std::string nvidia_smi = "nvidia-smi";  // looked up in PATH
  double timeout_s = 20;
};

std::string read_nvidia_smi_topo(const HostTopologyOptions& opts = {});

}  // namespace geoloco::planner

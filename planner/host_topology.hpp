// The GPU topology of this host, read from `nvidia-smi topo -m` at start-up: what
// site.strategy: auto acts on when a cuda site gives no topology.file.
//
// The command is `nvidia-smi topo -m`, or the executable named by GEOLOCO_NVIDIA_SMI (a wrapper
// where nvidia-smi is not on PATH; tests point it at a script printing a fixture), run without
// a shell, its output read to the end within `timeout_s`. Throws InputError naming the command
// and what went wrong: not found, killed, a non-zero exit (with its stderr), no output, or the
// deadline.
#pragma once

#include <string>

namespace geoloco::planner {

std::string read_nvidia_smi_topo(double timeout_s = 20);

}  // namespace geoloco::planner

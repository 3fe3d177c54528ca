// geoloco subcommands of the WAN emulator, registered by trainer/app (and by the dev driver
// geoloco_wan_dev until then):
//   wan-delayline  userspace delay line on one NFQUEUE (the netem fallback)
//   wan-pingpong   application-level TCP ping-pong server / client (RTT JSON)
//   wan-plan       scenario YAML -> namespaces, addresses, queues, rates (sh or JSON)
#pragma once

#include <CLI/CLI.hpp>

namespace geoloco::wan {

void add_wan_commands(CLI::App& app);

}  // namespace geoloco::wan

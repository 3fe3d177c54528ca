// Where a rank listens: the address it binds for its site's collective and its UCX gate, and
// the addresses it dials at the other sites (docs/shapes.md, "A site across nodes").
//
// A site whose config gives `host` (every rank) or `hosts` (one per rank) binds those. A site
// with `nodes: K` and no `hosts` gives only node 0's address (`host`): node 0's ranks bind it,
// a rank on another node binds the address it is given (`--bind-address`, or
// GEOLOCO_BIND_ADDRESS) or else the one its routing table uses to reach `host`. The site's
// ranks pool their addresses over the site collective; rank 0's gate serves them to the other
// sites (transport/site_directory.hpp), which ask for them before they connect.
#pragma once

#include <string>

#include "trainer/loop/run_config.hpp"

namespace geoloco::app {

// The address rank `rank` of `site` binds. `given`: --bind-address / GEOLOCO_BIND_ADDRESS ("":
// none). Throws InputError when `given` is not an IPv4 address or contradicts the config (a
// site whose ranks' addresses are configured, or node 0, whose address is `host`); Error when
// the route to `host` cannot be found.
std::string rank_address(const trainer::SiteConfig& site, int rank, const std::string& given);

}  // namespace geoloco::app

// Where a rank listens (rank_address.hpp).
#include "trainer/app/rank_address.hpp"

#include <arpa/inet.h>
#include <fmt/format.h>

#include "core/error.hpp"
#include "core/net.hpp"

namespace geoloco::app {

std::string rank_address(const trainer::SiteConfig& site, int rank, const std::string& given) {
  if (!given.empty()) {
    struct in_addr ip {};
    if (inet_pton(AF_INET, given.c_str(), &ip) != 1 || ip.s_addr == 0)
      throw InputError(fmt::format("--bind-address / GEOLOCO_BIND_ADDRESS '{}': not an IPv4 address to bind", given));
  }
  const bool finds = site.finds_addresses() && site.node_of(rank) > 0;
  if (!finds) {
    const std::string& configured = site.host_of(rank);
    if (!given.empty() && given != configured)
      throw InputError(fmt::format(
          "--bind-address / GEOLOCO_BIND_ADDRESS {}: rank {} of site {} binds {} from the config ({}); the option is "
          "for the ranks of a site across nodes (sites[].nodes) beyond node 0",
          given, rank, site.name, configured, site.finds_addresses() ? "node 0 binds host" : "host/hosts"));
    return configured;
  }
  if (!given.empty()) return given;
  try {
    return net::route_source_address(site.host);
  } catch (const Error& e) {
    throw Error(fmt::format("site {} rank {} (node {}): {}; give --bind-address", site.name, rank, site.node_of(rank),
                            e.what()));
  }
}

}  // namespace geoloco::app

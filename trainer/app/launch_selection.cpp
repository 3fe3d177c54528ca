// The ranks one `geoloco launch` starts (launch_selection.hpp).
#include "trainer/app/launch_selection.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "core/error.hpp"

namespace geoloco::app {

std::vector<std::string> site_nodes(const trainer::SiteConfig& site) {
  std::vector<std::string> nodes;
  for (int r = 0; r < site.ranks; ++r)
    if (std::find(nodes.begin(), nodes.end(), site.node_key(r)) == nodes.end()) nodes.push_back(site.node_key(r));
  return nodes;
}

std::vector<LaunchRank> select_launch_ranks(const trainer::RunConfig& cfg, const std::vector<std::string>& sites,
                                            int node) {
  std::string known;
  for (const auto& s : cfg.sites) known += (known.empty() ? "" : ", ") + s.name;
  std::vector<int> chosen;
  for (const auto& name : sites) {
    const int i = cfg.site_index(name);
    if (i < 0) throw InputError(fmt::format("--site {}: no such site in {} (its sites: {})", name, cfg.path, known));
    if (std::find(chosen.begin(), chosen.end(), i) == chosen.end()) chosen.push_back(i);
  }
  if (sites.empty())
    for (int i = 0; i < static_cast<int>(cfg.sites.size()); ++i) chosen.push_back(i);
  std::sort(chosen.begin(), chosen.end());
  if (node >= 0) {
    if (chosen.size() != 1 || sites.empty())
      throw InputError("--node I: give exactly one --site (the site whose I-th node this machine is)");
    const auto& s = cfg.sites[static_cast<size_t>(chosen[0])];
    const auto nodes = site_nodes(s);
    if (nodes.size() < 2)
      throw InputError(
          fmt::format("--node {}: site {} runs on one node (every rank at {}); give sites[].nodes (its ranks "
                      "find their own addresses) or sites[].hosts (one address per rank) for a site that spans nodes",
                      node, s.name, s.host));
    if (node >= static_cast<int>(nodes.size()))
      throw InputError(fmt::format("--node {}: site {} has {} nodes ({}); expected 0..{}", node, s.name, nodes.size(),
                                   fmt::join(nodes, ", "), nodes.size() - 1));
  }
  std::vector<LaunchRank> out;
  for (int i : chosen) {
    const auto& s = cfg.sites[static_cast<size_t>(i)];
    for (int r = 0; r < s.ranks; ++r)
      if (node < 0 || s.node_of(r) == node) out.push_back({i, r});
  }
  return out;
}

}  // namespace geoloco::app

// Which ranks `geoloco launch` starts on this machine: every rank of every site, or with
// `--site NAME` (repeatable) only those sites' -- each campus starts its own part, as torchrun
// does per node, so a run across campuses needs neither Slurm nor one machine that sees them
// all -- and with `--node I` only the ranks of one site that live on its I-th node (the I-th
// distinct address of its `hosts` in rank order, or the I-th run of ranks under `nodes`).
#pragma once

#include <string>
#include <vector>

#include "trainer/loop/run_config.hpp"

namespace geoloco::app {

struct LaunchRank {
  int site = 0;
  int rank = 0;
  bool operator==(const LaunchRank&) const = default;
};

// The site's nodes (SiteConfig::node_key) in order of their first rank.
std::vector<std::string> site_nodes(const trainer::SiteConfig& site);

// Throws InputError naming the problem: an unknown site, --node without exactly one --site, a
// site on one node (neither `nodes` nor per-rank `hosts`), a node index out of range.
std::vector<LaunchRank> select_launch_ranks(const trainer::RunConfig& cfg, const std::vector<std::string>& sites,
                                            int node);

}  // namespace geoloco::app

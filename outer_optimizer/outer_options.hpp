// OuterOptions: what one rank's outer loop is told at construction, as plain values. Built at
// the edge from a run's YAML (trainer/loop/outer_edge.hpp) or by hand (a test, a binding);
// the outer loop reads nothing else of a run's config.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "outer_optimizer/outer_config.hpp"
#include "outer_optimizer/outer_hooks.hpp"
#include "outer_optimizer/site.hpp"

namespace geoloco::outer {

// A site of the run, in config order (its index is its identity on the wire and in masks).
struct SiteSpec {
  std::string name;
  int ranks = 1;
};

struct OuterOptions {
  std::vector<SiteSpec> sites;
  int site = 0;  // this rank's site (index into sites)
  int rank = 0;  // this rank within it
  OuterConfig outer;
  ModelParams params;  // the model's flat parameters, by tensor
  // The run's last inner step: every fragment syncs blocking there, so all sites end equal.
  int64_t total_steps = 0;
  // The driver checkpoints at the multiples of this (0: never but at the end); with overlap,
  // the rounds in flight are decided at those steps so the checkpoint holds committed state.
  int64_t checkpoint_every = 0;
  // Tokens this site trains per inner step, over all its ranks (its contributions' weight
  // under outer.weighting: tokens, and the summary's counts).
  uint64_t tokens_per_step = 0;
  // The run's config hash: a joiner refuses state served under another config.
  uint64_t config_hash = 0;
  // The file the initial weights were loaded from (train.init_from), "" for a seeded init:
  // named when the sites' initial weights differ.
  std::string init_from;
  // What outer.plan: auto's model needs of the transport: the eager threshold (one latency
  // per round below it) and whether the link is emulated in process (no TCP handshakes).
  uint64_t eager_bytes = 8u << 20;
  bool emulated_link = false;
  OuterHooks hooks;  // a test's or benchmark's; product code sets none
  // This site joins a running job (Diloco::join follows): no start-up check with the other
  // sites, which are far past it.
  bool joining = false;

  int site_count() const { return static_cast<int>(sites.size()); }
  const std::string& site_name(int s) const { return sites.at(static_cast<size_t>(s)).name; }
  const std::string& name() const { return site_name(site); }
  int quorum() const { return outer.quorum(site_count()); }
  // Throws ConfigError naming the first inconsistency (no site, this site or rank out of
  // range, a site of no rank, parameters that do not tile their total).
  void validate() const;
};

}  // namespace geoloco::outer

// site.strategy: auto -- a site's strategy (and hybrid group size) from its GPU topology, by
// the cost model `geoloco topo` reports (planner/strategy_model.hpp).
//
// The workload is the run's: the model's parameters and layers, the site's grad_accum as
// micro-batches, compute time 6 x parameters x tokens per rank per step / (topology.gpu_tflops
// x 1e12), topology.gpu_memory_gb and activations_gb per GPU. Rank r runs on GPU r, so the
// topology (times topology.nodes) must have exactly as many GPUs as the site has ranks.
//
// hybrid maps group g onto ranks gG .. gG+G-1: it is taken only when the NVLink islands are of
// equal size and each is a run of consecutive GPU ids; otherwise it is left out and the rule
// picks among the other four. A hybrid whose one island spans every GPU is fsdp; islands of
// one GPU make it ddp. Pure arithmetic on the config and the topology: every rank of every
// site that reads the same file chooses the same.
#pragma once

#include <string>

#include "trainer/loop/run_config.hpp"
#include "trainer/parallel/collective.hpp"
#include "planner/host_topology.hpp"
#include "planner/strategy_model.hpp"
#include "planner/topology.hpp"

namespace geoloco::trainer {

struct StrategyChoice {
  std::string strategy;  // ddp | zero1 | zero2 | fsdp | hybrid
  int group_size = 0;    // hybrid: GPUs per island
  std::string reason;    // one line: the model's reason, and any mapping it needed
  planner::TopoPlan plan;
};

planner::Workload site_workload(const RunConfig& cfg, int site);

// `node_topo` is one node's; a site over topology.nodes nodes is that many copies joined by the
// network (planner::replicate_over_nodes, topology.node_link_gbs per GPU and direction), rank r
// on node r / gpus. Throws InputError when gpus x nodes is not the site's rank count.
StrategyChoice choose_strategy(const RunConfig& cfg, int site, const planner::Topology& node_topo);

// strategy: auto on a site without topology.file (a cuda site; a file is chosen from at config
// load): the site's rank 0 reads this host's `nvidia-smi topo -m` (planner::read_nvidia_smi_topo
// with `host`: which program, how long) and shares the text -- or its failure -- with the
// site's ranks over `coll` (null for one rank), so every rank chooses from the same text.
// Returns `cfg` with the site's strategy, group size and reason filled in (topology.file says
// "nvidia-smi topo -m"); `cfg` itself when the site's strategy is already chosen. Collective
// over the site: every rank calls it.
RunConfig choose_strategy_at_start(const RunConfig& cfg, int site, int rank, parallel::Collective* coll,
                                   const planner::HostTopologyOptions& host);

}  // namespace geoloco::trainer

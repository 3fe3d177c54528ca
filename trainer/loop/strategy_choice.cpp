// site.strategy: auto -- the choice from the site's topology (strategy_choice.hpp).
#include "trainer/loop/strategy_choice.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "core/error.hpp"

namespace geoloco::trainer {

planner::Workload site_workload(const RunConfig& cfg, int site) {
  const SiteConfig& s = cfg.sites.at(static_cast<size_t>(site));
  planner::Workload w;
  w.params = static_cast<double>(cfg.model.num_params());
  w.layers = cfg.model.n_layer;
  w.micro_batches = s.grad_accum;
  const double tokens = static_cast<double>(cfg.train.micro_batch) * s.grad_accum * cfg.seq_len();
  // Forward + backward of a dense transformer: ~6 FLOPs per parameter per token.
  w.compute_s = 6.0 * w.params * tokens / (s.topology.gpu_tflops * 1e12);
  w.gpu_memory_bytes = s.topology.gpu_memory_gb * 1e9;
  w.activation_bytes = s.topology.activations_gb * 1e9;
  return w;
}

namespace {

// The islands as groups of consecutive ranks: their common size, or 0 when they are not.
int consecutive_island_size(const std::vector<std::vector<int>>& islands) {
  const size_t size = islands.front().size();
  for (const auto& is : islands) {
    if (is.size() != size) return 0;
    std::vector<int> sorted = is;
    std::sort(sorted.begin(), sorted.end());
    if (sorted.front() % static_cast<int>(size) != 0) return 0;
    for (size_t i = 1; i < sorted.size(); ++i)
      if (sorted[i] != sorted[i - 1] + 1) return 0;
  }
  return static_cast<int>(size);
}

}  // namespace

StrategyChoice choose_strategy(const RunConfig& cfg, int site, const planner::Topology& node_topo) {
  const SiteConfig& s = cfg.sites.at(static_cast<size_t>(site));
  const auto& t = s.topology;
  if (node_topo.gpus() * t.nodes != s.ranks)
    throw InputError(
        fmt::format("topology {} has {} GPUs{} but site '{}' has {} ranks (rank r runs on GPU r): give "
                    "the topology of the site's GPUs{}",
                    node_topo.name(), node_topo.gpus(), t.nodes > 1 ? fmt::format(" per node x {} nodes", t.nodes) : "",
                    s.name, s.ranks, t.nodes > 1 ? "" : " (topology.nodes: a site over several nodes of it)"));
  const planner::Topology topo =
      planner::replicate_over_nodes(node_topo, t.nodes, t.node_link_gbs * 1e9, t.node_link_latency_us * 1e-6);
  StrategyChoice c;
  c.plan = planner::plan_topology(topo, site_workload(cfg, site));
  planner::Strategy pick = c.plan.recommended;
  c.reason = c.plan.reason;
  const int island = consecutive_island_size(c.plan.islands);
  if (pick == planner::Strategy::Hybrid && island == 0) {
    using planner::Strategy;
    constexpr Strategy others[] = {Strategy::DDP, Strategy::Zero1, Strategy::Zero2, Strategy::FSDP};
    pick = planner::recommend(c.plan.costs, others);
    c.reason = fmt::format(
        "{}; but the NVLink islands are not equal runs of consecutive GPUs, so hybrid's groups of "
        "consecutive ranks cannot follow them: {} instead",
        c.plan.reason, planner::strategy_name(pick));
  }
  if (pick == planner::Strategy::Hybrid) {
    if (island == s.ranks) {
      c.strategy = "fsdp";
      c.reason += "; one island spans every GPU: hybrid is fsdp";
    } else if (island <= 1) {
      c.strategy = "ddp";
      c.reason += "; islands of one GPU: hybrid is ddp";
    } else {
      c.strategy = "hybrid";
      c.group_size = island;
    }
  } else {
    c.strategy = planner::strategy_name(pick);
  }
  return c;
}

RunConfig choose_strategy_at_start(const RunConfig& cfg, int site, int rank, parallel::Collective* coll,
                                   const planner::HostTopologyOptions& host) {
  const SiteConfig& s = cfg.sites.at(static_cast<size_t>(site));
  if (!s.strategy_auto || s.strategy != "auto") return cfg;
  // Rank 0's text, or "!" and its error, to every rank.
  std::string blob;
  if (rank == 0) {
    try {
      blob = "=" + planner::read_nvidia_smi_topo(host);
    } catch (const InputError& e) {
      blob = std::string("!") + e.what();
    }
  }
  if (coll && coll->size() > 1) {
    auto all = coll->all_gather_bytes(std::as_bytes(std::span<const char>(blob.data(), blob.size())));
    blob.assign(reinterpret_cast<const char*>(all.at(0).data()), all.at(0).size());
  }
  const std::string where = fmt::format("site '{}': strategy: auto", s.name);
  if (blob.empty()) throw InputError(where + ": the site's rank 0 shared no topology");
  if (blob[0] == '!') throw InputError(fmt::format("{}: {}", where, blob.substr(1)));
  const planner::Topology topo =
      planner::parse_nvidia_smi_topo(blob.substr(1), "nvidia-smi topo -m (site rank 0)", planner::LinkAssumptions{});
  StrategyChoice c;
  try {
    c = choose_strategy(cfg, site, topo);
  } catch (const InputError& e) {
    throw InputError(fmt::format("{}: {}", where, e.what()));
  }
  RunConfig out = cfg;
  SiteConfig& o = out.sites.at(static_cast<size_t>(site));
  o.strategy = c.strategy;
  o.group_size = c.group_size;
  o.strategy_reason = c.reason;
  o.topology.file = "nvidia-smi topo -m";
  return out;
}

}  // namespace geoloco::trainer

// The planner's subcommands, wired into build/geoloco by trainer/app:
//   geoloco budget  WAN sync cost, TCP window cap, utilization, smallest H (docs/planning.md)
//   geoloco topo    intra-site ddp/zero1/zero2/fsdp/hybrid cost and a recommendation
// Callbacks print to stdout and throw geoloco::InputError on bad input (exit 2).
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

namespace geoloco::planner {

void add_budget_command(CLI::App& app);
void add_topo_command(CLI::App& app);

// What the budget flags turn into: `--set`-style overrides on the budget document, applied
// after --from FILE (exposed for tests). Flags naming alternatives clear each other
// (--km clears link.rtt_ms, --params clears a model config section).
struct BudgetFlags {
  std::string from;
  std::vector<std::string> sets;
  std::string params, config, bits, bytes_per_value, sites, km, rtt_ms, rate_gbps, links, tcp_rmem_max;
  std::string step_time, H, fragments, overlap, ranks, lanes, pattern, target, h_floor, h_max;
  double outer_lr = 0;  // > 0: apply the quality floor for this outer lr
  bool slow_start = false;
  bool json = false;
  std::string plot;  // --plot FILE (.svg or .png): the budget as a picture
};
std::vector<std::string> budget_overrides(const BudgetFlags& f);
// Runs `geoloco budget` and returns what it prints.
std::string run_budget(const BudgetFlags& f);

struct TopoFlags {
  std::string topology;  // file, or "-" for stdin
  std::string params, config;
  std::string site;  // with config: that site's strategy: auto inputs
  int layers = 0;
  double compute_s = 0;
  int micro_batches = 1;
  double tokens_per_gpu = 0;
  double gpu_tflops = 0;
  double gpu_memory_gb = 80;
  double activations_gb = 0;
  double grad_bytes = 2;
  int nodes = 1;              // copies of the topology joined by the network
  double node_link_gbs = 50;  // per GPU and direction between nodes
  bool json = false;
};
std::string run_topo(const TopoFlags& f);

}  // namespace geoloco::planner

#include "tools/planner/cli.hpp"

#include "planner/quality_floor.hpp"

#include <fmt/format.h>

#include <iostream>
#include <sstream>

#include "planner/budget.hpp"
#include "tools/planner/budget_plot.hpp"
#include "tools/planner/budget_report.hpp"
#include "planner/quantity.hpp"
#include "planner/strategy_model.hpp"
#include "planner/topology.hpp"
#include "planner/yaml_section.hpp"
#include "core/config_node.hpp"
#include "trainer/loop/run_config.hpp"
#include "trainer/loop/strategy_choice.hpp"
#include "trainer/model/model_config.hpp"

namespace geoloco::planner {
namespace {

// The model section of a training run config (its `model:` key).
trainer::ModelConfig model_from_run_config(const std::string& path) {
  auto doc = config::load_file(path);
  auto root = doc.node();
  if (!root.has("model")) root.fail("model", "missing: the run config has no model: section");
  return trainer::ModelConfig::from_yaml(root.child("model"));
}

}  // namespace

namespace {

// One override and the flag it came from, so errors can quote what the user typed.
struct Override {
  std::string spec;  // key.path=value
  std::string flag;  // "--sites abc"; empty for --set and implied clears
};

std::vector<Override> flag_overrides(const BudgetFlags& f) {
  std::vector<Override> o;
  auto set = [&](const char* key, const char* flag, const std::string& v) {
    if (!v.empty()) o.push_back({fmt::format("{}={}", key, v), fmt::format("{} {}", flag, v)});
  };
  if (!f.params.empty() && !f.config.empty()) throw InputError("budget: give --params or --config, not both");
  if (!f.km.empty() && !f.rtt_ms.empty()) throw InputError("budget: give --km or --rtt-ms, not both");
  if (!f.params.empty()) {
    o.push_back({"model=null", ""});
    set("model.params", "--params", f.params);
  }
  if (!f.config.empty()) {
    auto mc = model_from_run_config(f.config);
    o.push_back({"model=null", ""});
    o.push_back({fmt::format("model.params={}", mc.num_params()), "--config " + f.config});
  }
  set("compression.bits", "--bits", f.bits);
  set("compression.bytes_per_value", "--bytes-per-value", f.bytes_per_value);
  set("sites", "--sites", f.sites);
  if (!f.km.empty()) {
    o.push_back({"link.rtt_ms=null", ""});
    set("link.distance_km", "--km", f.km);
  }
  if (!f.rtt_ms.empty()) {
    o.push_back({"link.distance_km=null", ""});
    set("link.rtt_ms", "--rtt-ms", f.rtt_ms);
  }
  set("link.rate_gbps", "--rate-gbps", f.rate_gbps);
  set("link.parallel_links", "--links", f.links);
  set("link.tcp_rmem_max", "--tcp-rmem-max", f.tcp_rmem_max);
  if (f.slow_start) o.push_back({"link.slow_start=true", "--slow-start"});
  set("schedule.step_time_s", "--step-time", f.step_time);
  set("schedule.H", "-H", f.H);
  set("schedule.fragments", "--fragments", f.fragments);
  set("schedule.overlap_steps", "--overlap", f.overlap);
  set("schedule.ranks", "--ranks", f.ranks);
  set("schedule.lanes", "--lanes", f.lanes);
  set("schedule.pattern", "--pattern", f.pattern);
  set("target.utilization", "--target", f.target);
  set("target.h_floor", "--h-floor", f.h_floor);
  set("target.h_max", "--h-max", f.h_max);
  for (const auto& s : f.sets) o.push_back({s, ""});
  return o;
}

}  // namespace

std::vector<std::string> budget_overrides(const BudgetFlags& f) {
  std::vector<std::string> out;
  for (const auto& o : flag_overrides(f)) out.push_back(o.spec);
  return out;
}

std::string run_budget(const BudgetFlags& f) {
  const auto overrides = flag_overrides(f);
  const auto specs = budget_overrides(f);
  try {
    config::Document doc =
        f.from.empty() ? config::load_string(fmt::format("format: {}\nversion: {}\n", kBudgetFormat, kBudgetVersion),
                                             "<flags>", specs)
                       : config::load_file(f.from, specs);
    if (!f.plot.empty()) (void)plot::format_for(f.plot, "--plot");  // before any work
    BudgetInput in = BudgetInput::from_yaml(doc.node());
    // The quality floor (planner/quality_floor.hpp): an outer lr above 0.7
    // keeps the search at H >= 25.
    if (f.outer_lr > 0) in.h_floor = planner::quality_h_floor(in.h_floor, "nesterov", f.outer_lr);
    auto report = plan_budget(in);
    if (!f.plot.empty()) write_budget_plot(report, f.plot);
    return f.json ? budget_json(report).dump(2) + "\n" : format_budget_table(report);
  } catch (const ConfigError& e) {
    // Core locates an overridden value as "(--set key=value)"; name the flag instead.
    std::string msg = e.what();
    for (const auto& o : overrides) {
      if (o.flag.empty()) continue;
      const std::string from = "(--set " + o.spec + ")";
      for (auto pos = msg.find(from); pos != std::string::npos; pos = msg.find(from, pos))
        msg.replace(pos, from.size(), "(" + o.flag + ")");
    }
    throw ConfigError(msg);
  }
}

// --config RUN.yaml --site NAME: what that site's strategy: auto sees -- the run's workload and
// the site's topology section (its file unless --topology is given, its nodes and link).
std::string run_topo_for_site(const TopoFlags& f) {
  if (f.config.empty()) throw InputError("topo: --site needs --config (the run config holding the site)");
  if (!f.params.empty() || f.layers != 0 || f.compute_s > 0 || f.tokens_per_gpu > 0 || f.gpu_tflops > 0 ||
      f.micro_batches != 1 || f.nodes != 1)
    throw InputError(
        "topo: with --site the workload and the nodes come from the run config (the site's topology: section); "
        "drop --params, --layers, --compute-s, --tokens-per-gpu, --gpu-tflops, --micro-batches and --nodes");
  const trainer::RunConfig cfg = trainer::load_run_config(f.config);
  const int site = cfg.site_index(f.site);
  if (site < 0) throw InputError(fmt::format("topo: --site {}: no such site in {}", f.site, f.config));
  const auto& s = cfg.sites[static_cast<size_t>(site)];
  const std::string file = !f.topology.empty() ? f.topology : s.topology.file;
  if (file.empty()) throw InputError(fmt::format("topo: site {} has no topology.file: give --topology FILE", f.site));
  Topology topo = replicate_over_nodes(load_topology_file(file), s.topology.nodes, s.topology.node_link_gbs * 1e9,
                                       s.topology.node_link_latency_us * 1e-6);
  auto plan = plan_topology(topo, trainer::site_workload(cfg, site));
  return f.json ? topo_json(plan).dump(2) + "\n" : format_topo_table(plan);
}

std::string run_topo(const TopoFlags& f) {
  if (!f.site.empty()) return run_topo_for_site(f);
  if (f.topology.empty()) throw InputError("topo: --topology FILE is required (nvidia-smi topo -m text or YAML)");
  Topology topo = [&] {
    if (f.topology != "-") return load_topology_file(f.topology);
    std::stringstream ss;
    ss << std::cin.rdbuf();
    return parse_nvidia_smi_topo(ss.str(), "<stdin>", LinkAssumptions{});
  }();
  Workload w;
  if (f.params.empty() == f.config.empty()) throw InputError("topo: give exactly one of --params or --config");
  if (!f.params.empty()) {
    w.params = parse_count(f.params, "--params");
  } else {
    auto mc = model_from_run_config(f.config);
    w.params = static_cast<double>(mc.num_params());
    w.layers = mc.n_layer;
  }
  if (f.layers < 0) throw InputError(fmt::format("topo: --layers: got {}, expected >= 1", f.layers));
  if (f.layers > 0) w.layers = f.layers;
  if (f.compute_s > 0) {
    if (f.tokens_per_gpu > 0 || f.gpu_tflops > 0)
      throw InputError("topo: give --compute-s, or --tokens-per-gpu with --gpu-tflops, not both");
    w.compute_s = f.compute_s;
  } else if (f.tokens_per_gpu > 0 && f.gpu_tflops > 0) {
    // Forward + backward of a dense transformer: ~6 FLOPs per parameter per token.
    w.compute_s = 6.0 * w.params * f.tokens_per_gpu / (f.gpu_tflops * 1e12);
  } else {
    throw InputError(
        "topo: the step's compute time is needed: --compute-s, or --tokens-per-gpu and "
        "--gpu-tflops (achieved, not peak)");
  }
  if (!(f.gpu_memory_gb > 0))
    throw InputError(fmt::format("topo: --gpu-memory-gb: got {}, expected > 0", f.gpu_memory_gb));
  if (f.activations_gb < 0)
    throw InputError(fmt::format("topo: --activations-gb: got {}, expected >= 0", f.activations_gb));
  if (!(f.grad_bytes > 0)) throw InputError(fmt::format("topo: --grad-bytes: got {}, expected > 0", f.grad_bytes));
  w.gpu_memory_bytes = f.gpu_memory_gb * 1e9;
  w.activation_bytes = f.activations_gb * 1e9;
  w.grad_bytes = f.grad_bytes;
  if (f.micro_batches < 1)
    throw InputError(fmt::format("topo: --micro-batches: got {}, expected >= 1", f.micro_batches));
  w.micro_batches = f.micro_batches;
  if (f.nodes < 1) throw InputError(fmt::format("topo: --nodes: got {}, expected >= 1", f.nodes));
  if (!(f.node_link_gbs > 0))
    throw InputError(fmt::format("topo: --node-link-gbs: got {}, expected > 0", f.node_link_gbs));
  topo = replicate_over_nodes(topo, f.nodes, f.node_link_gbs * 1e9, 5e-6);
  auto plan = plan_topology(topo, w);
  return f.json ? topo_json(plan).dump(2) + "\n" : format_topo_table(plan);
}

void add_budget_command(CLI::App& app) {
  auto f = std::make_shared<BudgetFlags>();
  auto* cmd = app.add_subcommand("budget",
                                 "WAN budget of a DiLoCo sync: bytes, transfer time, TCP window cap, "
                                 "utilization, smallest H (docs/planning.md)");
  cmd->add_option("--from", f->from, "budget YAML (written by geoloco probe, or by hand); flags override it");
  cmd->add_option("--set", f->sets, "override any key: --set link.rtt_ms=40 (repeatable)");
  cmd->add_option("--params", f->params, "model parameters: 124M, 7B, 1T, 1.5e12");
  cmd->add_option("--config", f->config, "take the model from a run config's model: section");
  cmd->add_option("--bits", f->bits, "bits per value after compression: 32, 16, 8, 4, 2");
  cmd->add_option("--bytes-per-value", f->bytes_per_value, "bytes per value on the wire (overrides --bits)");
  cmd->add_option("--sites", f->sites, "number of sites");
  cmd->add_option("--km", f->km, "fiber distance between sites (5 us/km one way)");
  cmd->add_option("--rtt-ms", f->rtt_ms, "round trip time instead of a distance");
  cmd->add_option("--rate-gbps", f->rate_gbps, "one WAN link's rate, Gbit/s");
  cmd->add_option("--links", f->links, "parallel WAN links per site");
  cmd->add_option("--tcp-rmem-max", f->tcp_rmem_max, "net.ipv4.tcp_rmem max (6MiB default)");
  cmd->add_flag("--slow-start", f->slow_start, "model TCP slow start after idle on every sync");
  cmd->add_option("--step-time", f->step_time, "inner step time, seconds");
  cmd->add_option("-H,--H", f->H, "inner steps between syncs");
  cmd->add_option("--fragments", f->fragments, "streaming fragments");
  cmd->add_option("--overlap", f->overlap, "overlap steps (tau) a fragment sync may take");
  cmd->add_option("--ranks", f->ranks, "ranks per site (connections per site pair)");
  cmd->add_option("--lanes", f->lanes, "connections per rank pair");
  cmd->add_option("--pattern", f->pattern,
                  "all_to_all (geoloco's default), owner (outer.exchange: owner) or ring (comparison)");
  cmd->add_option("--target", f->target, "target compute utilization for the smallest-H search");
  cmd->add_option("--h-floor", f->h_floor, "smallest H allowed for model quality (default 25)");
  cmd->add_option("--h-max", f->h_max, "largest H searched");
  cmd->add_option("--outer-lr", f->outer_lr,
                  "the run's outer (Nesterov) lr: above 0.7 the H floor rises to 25, as outer.plan: auto does "
                  "(docs/quality.md)")
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--json", f->json, "print JSON");
  cmd->add_option("--plot", f->plot,
                  "also draw utilization against H and against distance per codec, the plan marked (.svg or .png)");
  cmd->callback([f] { std::cout << run_budget(*f) << std::flush; });
}

void add_topo_command(CLI::App& app) {
  auto f = std::make_shared<TopoFlags>();
  auto* cmd = app.add_subcommand("topo",
                                 "intra-site strategy planner: ddp/zero1/zero2/fsdp/hybrid step time and "
                                 "memory on a GPU topology, with a recommendation");
  cmd->add_option("--topology", f->topology,
                  "nvidia-smi topo -m output, or a topology YAML; - reads stdin (with --site: instead of the site's)");
  cmd->add_option("--site", f->site,
                  "with --config: the workload and topology that site's strategy: auto sees (the run's model, batch, "
                  "grad_accum; the site's topology: section)");
  cmd->add_option("--params", f->params, "model parameters: 1.3B, 7B");
  cmd->add_option("--config", f->config, "take the model from a run config's model: section");
  cmd->add_option("--layers", f->layers, "transformer layers (fsdp units); default from --config, else 32");
  cmd->add_option("--compute-s", f->compute_s, "forward+backward time of one step on one GPU, seconds");
  cmd->add_option("--micro-batches", f->micro_batches, "gradient accumulation steps per optimizer step (default 1)");
  cmd->add_option("--tokens-per-gpu", f->tokens_per_gpu, "tokens per GPU per step (with --gpu-tflops)");
  cmd->add_option("--gpu-tflops", f->gpu_tflops, "achieved TFLOP/s per GPU (with --tokens-per-gpu)");
  cmd->add_option("--gpu-memory-gb", f->gpu_memory_gb, "memory per GPU, GB (default 80)");
  cmd->add_option("--activations-gb", f->activations_gb, "activation memory per GPU, GB (default 0)");
  cmd->add_option("--grad-bytes", f->grad_bytes, "bytes per gradient value in collectives (2 bf16, 4 fp32)");
  cmd->add_option("--nodes", f->nodes, "the site spans this many nodes of this topology (default 1)");
  cmd->add_option("--node-link-gbs", f->node_link_gbs,
                  "GB/s per GPU and direction between nodes: its share of the NICs (default 50)");
  cmd->add_flag("--json", f->json, "print JSON");
  cmd->callback([f] { std::cout << run_topo(*f) << std::flush; });
}

}  // namespace geoloco::planner

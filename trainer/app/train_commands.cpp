// geoloco validate / train / worker / launch.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "tools/planner/cli.hpp"
#include "tools/report/cli.hpp"
#include "tools/probe/cli.hpp"
#include "tools/wan/cli.hpp"
#include "planner/quality_floor.hpp"
#include "outer_optimizer/site_peers.hpp"
#include "trainer/app/commands.hpp"
#include "trainer/app/rank_runner.hpp"
#include "trainer/app/run_summary.hpp"
#include "core/error.hpp"
#include "core/hash.hpp"
#include "core/log.hpp"
#include "trainer/data/open_data.hpp"
#include "trainer/loop/metrics.hpp"
#include "trainer/loop/outer_edge.hpp"
#include "trainer/loop/run_config.hpp"
#include "trainer/loop/trainer.hpp"
#include "trainer/model/param_layout.hpp"

namespace geoloco::app {

namespace {

struct ConfigArgs {
  std::string config;
  std::vector<std::string> sets;
};

void add_config_args(CLI::App* cmd, ConfigArgs& a) {
  cmd->add_option("config", a.config, "run config (YAML)")->required();
  cmd->add_option("--set", a.sets, "override a key: --set train.steps=100 (repeatable; a.b.c=value, lists by index)");
}

void run_validate(const ConfigArgs& a) {
  auto cfg = trainer::load_run_config(a.config, a.sets);
  if (cfg.external_inner_loop()) {
    std::string sites;
    for (const auto& s : cfg.sites) sites += fmt::format("{}{}x{}", sites.empty() ? "" : ", ", s.name, s.ranks);
    fmt::print("{}: OK -- each rank runs `{}` (run.command), sites: {}; {} steps; config hash {}\n", a.config,
               fmt::join(cfg.run.command, " "), sites, cfg.train.steps, hex64(cfg.hash));
    return;
  }
  // Data is part of the config: open it (validates files, token ranges, sizes).
  auto data = trainer::open_data(cfg.data, cfg.dir, cfg.model.vocab_size);
  std::string sites;
  for (const auto& s : cfg.sites)
    sites += fmt::format("{}{}x{} ({}{}{})", sites.empty() ? "" : ", ", s.name, s.ranks,
                         s.strategy == "auto" ? "auto: nvidia-smi topo -m at start" : s.strategy,
                         s.group_size > 0 ? fmt::format(", groups of {}", s.group_size) : "",
                         s.grad_accum != cfg.train.grad_accum ? fmt::format(", grad_accum {}", s.grad_accum) : "");
  fmt::print(
      "{}: OK -- {:.2f}M parameters, sites: {}; {} steps of {} sequences x {} tokens per rank; "
      "train {}; config hash {}\n",
      a.config, cfg.model.num_params() / 1e6, sites, cfg.train.steps, cfg.train.micro_batch * cfg.train.grad_accum,
      cfg.seq_len(), data.train->describe(), hex64(cfg.hash));
  for (const auto& s : cfg.sites)
    if (s.strategy_auto && s.strategy != "auto")
      fmt::print("  site {}: strategy: auto chose {} from {}: {}\n", s.name, s.strategy, s.topology.file,
                 s.strategy_reason);
  for (const auto& s : cfg.sites)
    if (s.finds_addresses())
      fmt::print(
          "  site {}: {} ranks on {} nodes ({} per node); node 0's bind {}, the others find their own address "
          "(--bind-address, GEOLOCO_BIND_ADDRESS, or the route to {}) and the other sites learn it from rank 0; "
          "start each node with `geoloco launch {} --site {} --node I`\n",
          s.name, s.ranks, s.nodes, s.ranks / s.nodes, s.host, s.host, a.config, s.name);
  if (!cfg.train.init_from.empty())
    fmt::print("  parameters start from {} (train.init_from; checked)\n", cfg.train.init_from);
  if (cfg.train.rehearsal.enabled)
    fmt::print(
        "  rehearsal (train.rehearsal): stand-in inner steps of {} s moving each shard by a seeded drift; no "
        "model compute, no loss; the outer loop runs at the model's full size\n",
        cfg.train.rehearsal.step_seconds);
  if (cfg.sites.size() > 1 && !cfg.outer.auto_plan())
    if (auto note =
            planner::outer_lr_note(outer::name(cfg.outer.optimizer.kind), cfg.outer.optimizer.lr, cfg.outer.interval))
      fmt::print("  note: {}\n", *note);
  // Sites of different shapes (docs/shapes.md): how they exchange, and whether their batches differ.
  if (cfg.sites.size() > 1) {
    const outer::ExchangeLayout layout =
        outer::SitePeers::layout_of(trainer::outer_sites(cfg), trainer::ParamLayout(cfg.model).total());
    if (!layout.uniform())
      fmt::print(
          "  sites of different rank counts: the parameters are cut into {} pieces; each rank exchanges every "
          "piece of its shard with that piece's owner at the other sites\n",
          layout.pieces().size());
    const size_t S = cfg.sites.size();
    if (cfg.outer.owner_exchange())
      fmt::print(
          "  exchange: owner (outer.exchange): each site owns 1/{} of every segment and sends its average back; a "
          "site sends {:.3g} shards per round instead of {} (all_to_all), in two phases; every site is needed in "
          "every round\n",
          S, 2.0 * double(S - 1) / double(S), S - 1);
    else if (cfg.outer.exchange_auto())
      fmt::print("  exchange: auto (outer.exchange): the plan chooses all_to_all or owner from the measured path\n");
    // GPU sites: where their rounds are quantized (outer.quantize_on, docs/gpu.md).
    std::string gpus;
    for (const auto& s : cfg.sites)
      if (s.device == "cuda") gpus += (gpus.empty() ? "" : ", ") + s.name;
    const auto& pc = cfg.outer.compression;
    const bool device_codec = outer::device_quantizable(pc);
    if (!gpus.empty()) {
      if (cfg.outer.quantize_on == outer::QuantizeOn::Host)
        fmt::print("  GPU site(s) {}: the fp32 shard is staged to the host for each round (outer.quantize_on: host)\n",
                   gpus);
      else if (cfg.outer.auto_plan())
        fmt::print(
            "  GPU site(s) {}: rounds quantized on the device when the plan's codec is int8/int4/int2 "
            "(outer.quantize_on: {}), on the host otherwise\n",
            gpus, outer::name(cfg.outer.quantize_on));
      else if (device_codec)
        fmt::print(
            "  GPU site(s) {}: {} quantized on the device, only scales and codes copied to the host "
            "(outer.quantize_on: {})\n",
            gpus, compression::codec_name(pc.codec), outer::name(cfg.outer.quantize_on));
      else
        fmt::print(
            "  GPU site(s) {}: {} is quantized on the host (outer.quantize_on: auto; the device makes "
            "int8/int4/fp4/int2 without top-k)\n",
            gpus, pc.describe());
    }
    std::string batches;
    bool differ = false;
    for (size_t i = 0; i < cfg.sites.size(); ++i) {
      const int64_t b = cfg.site_batch(static_cast<int>(i));
      differ = differ || b != cfg.site_batch(0);
      batches += fmt::format("{}{} {}", i ? ", " : "", cfg.sites[i].name, b);
    }
    if (differ)
      fmt::print("  sites train different batches per inner step ({} sequences); {}\n", batches,
                 cfg.outer.weighting == outer::Weighting::Tokens
                     ? "their pseudo-gradients are weighed by the tokens each trained (outer.weighting: tokens)"
                     : "their pseudo-gradients count equally (outer.weighting: uniform): outer.weighting: tokens "
                       "weighs them by tokens, sites[].grad_accum evens the batches");
  }
}

struct TrainArgs : ConfigArgs {
  bool resume = false;
  int64_t stop_at = 0;
};

void run_train(const TrainArgs& a) {
  auto cfg = trainer::load_run_config(a.config, a.sets);
  if (cfg.external_inner_loop())
    throw InputError(fmt::format("{}: its ranks run run.command (their own inner loop): use `geoloco launch {}`",
                                 a.config, a.config));
  if (cfg.world_size() != 1)
    throw InputError(
        fmt::format("{}: `train` runs one process, but the config has {} ranks over {} site(s); "
                    "use `geoloco launch {}`",
                    a.config, cfg.world_size(), cfg.sites.size(), a.config));
  log::init("", cfg.run.log_level);
  RankOptions o;
  o.resume = a.resume;
  o.stop_at_step = a.stop_at;
  o.host_topology = host_topology_from_env();
  auto summary = run_rank(cfg, o);
  print_human_summary(cfg, summary);
}

}  // namespace

void add_train_commands(CLI::App& app) {
  {
    auto a = std::make_shared<ConfigArgs>();
    auto* cmd = app.add_subcommand("validate", "Check a run config (and its data files) without running it");
    add_config_args(cmd, *a);
    cmd->callback([a] { run_validate(*a); });
  }
  {
    auto a = std::make_shared<TrainArgs>();
    auto* cmd = app.add_subcommand("train", "Train in this process (a config with one site of one rank)");
    add_config_args(cmd, *a);
    cmd->add_flag("--resume", a->resume, "continue from the newest checkpoint in run.output_dir");
    cmd->add_option("--stop-at-step", a->stop_at, "stop cleanly with a checkpoint after this step (resume later)")
        ->check(CLI::NonNegativeNumber);
    cmd->callback([a] { run_train(*a); });
  }
}

void register_commands(CLI::App& app) {
  add_train_commands(app);
  add_worker_commands(app);
  add_eval_command(app);
  add_sample_command(app);
  planner::add_budget_command(app);
  planner::add_topo_command(app);
  probe::add_probe_command(app);
  report::add_report_command(app);
  wan::add_wan_commands(app);
}

}  // namespace geoloco::app

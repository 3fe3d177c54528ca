// geoloco worker (one rank) and geoloco launch (every rank of every site on this machine).
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <climits>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "trainer/app/launch_selection.hpp"
#include "trainer/app/rank_runner.hpp"
#include "trainer/app/commands.hpp"
#include "trainer/app/run_summary.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "trainer/launch/launcher.hpp"
#include "trainer/launch/rank_env.hpp"
#include "trainer/launch/slurm_env.hpp"
#include "trainer/loop/run_config.hpp"
#include "trainer/loop/trainer.hpp"

namespace geoloco::app {

namespace {

struct WorkerArgs {
  std::string config;
  std::vector<std::string> sets;
  std::string site;
  int rank = -1;
  bool resume = false;
  bool join = false;
  int64_t stop_at = 0;
  std::string capture_dir;
  std::string bind_address;  // --bind-address (else GEOLOCO_BIND_ADDRESS): a rank that finds its own address
};

std::string self_exe() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) throw Error("cannot resolve /proc/self/exe");
  return std::string(buf, static_cast<size_t>(n));
}

// run.command: the environment of the rank's program (over the Python package, python/): its
// place, its site's torch.distributed rendezvous (the environment torchrun gives) and how to
// find the config (python/geoloco/env.py reads it).
std::vector<std::pair<std::string, std::string>> command_env(const trainer::RunConfig& cfg, const WorkerArgs& a,
                                                             int site, int rank) {
  const auto& s = cfg.sites[static_cast<size_t>(site)];
  launch::RankEnv re;
  re.site = s.name;
  re.site_index = site;
  re.rank = rank;
  re.site_size = s.ranks;
  re.global_rank = cfg.global_rank(site, rank);
  re.world_size = cfg.world_size();
  re.local_rank = rank;
  auto env = re.to_env();
  std::string sets;
  for (const auto& kv : a.sets) sets += (sets.empty() ? "" : "\n") + kv;
  const auto exe_dir = std::filesystem::path(self_exe()).parent_path();
  std::string pythonpath = (exe_dir / "python").string();
  if (const char* old = std::getenv("PYTHONPATH"); old != nullptr && *old != '\0') pythonpath += ":" + std::string(old);
  const std::vector<std::pair<std::string, std::string>> more = {
      {"GEOLOCO_LAUNCHED", "1"},
      {"GEOLOCO_CONFIG", std::filesystem::absolute(a.config).lexically_normal().string()},
      {"GEOLOCO_SETS", sets},
      {"GEOLOCO_RESUME", a.resume ? "1" : "0"},
      {"GEOLOCO_JOIN", a.join ? "1" : "0"},
      {"GEOLOCO_BIN", self_exe()},
      // torch.distributed inside the site (env:// rendezvous, as torchrun sets it): the
      // site's rank 0 serves it at the site's host, on the port after its ranks' WAN ports.
      {"RANK", std::to_string(rank)},
      {"WORLD_SIZE", std::to_string(s.ranks)},
      {"LOCAL_RANK", std::to_string(rank)},
      {"LOCAL_WORLD_SIZE", std::to_string(s.ranks)},
      {"MASTER_ADDR", s.host},
      {"MASTER_PORT", std::to_string(s.port + s.ranks)},
      {"PYTHONPATH", pythonpath},
      {"OMP_NUM_THREADS", std::to_string(cfg.train.threads)}};
  env.insert(env.end(), more.begin(), more.end());
  return env;
}

// `geoloco worker` of a run.command run (under srun, or by hand): this process becomes the
// rank's program, with the environment `geoloco launch` would give it.
[[noreturn]] void exec_command(const trainer::RunConfig& cfg, const WorkerArgs& a, int site, int rank) {
  for (const auto& [k, v] : command_env(cfg, a, site, rank)) ::setenv(k.c_str(), v.c_str(), 1);
  std::vector<char*> argv;
  for (const auto& arg : cfg.run.command) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  ::execvp(argv[0], argv.data());
  throw InputError(
      fmt::format("{}: run.command: cannot run {}: {}", a.config, cfg.run.command[0], std::strerror(errno)));
}

void run_worker(const WorkerArgs& a) {
  auto cfg = trainer::load_run_config(a.config, a.sets);
  int site = -1, rank = a.rank;
  if (!a.site.empty()) {
    site = cfg.site_index(a.site);
    if (site < 0) throw InputError(fmt::format("--site {}: no such site in {}", a.site, a.config));
  } else if (std::getenv("SLURM_PROCID")) {
    std::vector<int> counts;
    for (const auto& s : cfg.sites) counts.push_back(s.ranks);
    auto p = launch::env_rank_from_slurm(counts);
    site = p.site_index;
    rank = p.rank_in_site;
  } else {
    throw InputError("worker: give --site NAME --rank R (or run under srun, which sets SLURM_PROCID)");
  }
  const auto& sc = cfg.sites[static_cast<size_t>(site)];
  if (rank < 0 || rank >= sc.ranks)
    throw InputError(fmt::format("--rank {}: site {} has ranks 0..{}", rank, sc.name, sc.ranks - 1));
  // run.command: this process becomes the rank's program (srun geoloco worker, or by hand).
  if (cfg.external_inner_loop()) exec_command(cfg, a, site, rank);
  // Under `geoloco launch` the launcher already prefixes every line with [site/rank].
  const bool launched = std::getenv("GEOLOCO_LAUNCHED") != nullptr;
  log::init(launched ? "" : fmt::format("{}/{}", sc.name, rank), cfg.run.log_level);
  RankOptions o;
  o.site = site;
  o.rank = rank;
  o.resume = a.resume;
  o.join = a.join;
  o.stop_at_step = a.stop_at;
  o.outer_hooks.capture_dir = a.capture_dir;
  o.bind_address = a.bind_address;
  if (const char* env = std::getenv("GEOLOCO_BIND_ADDRESS"); o.bind_address.empty() && env != nullptr)
    o.bind_address = env;
  o.host_topology = host_topology_from_env();
  // The launcher's terminal status view: the site's rank 0 reports there, and the per-step
  // progress lines it replaces are not printed.
  if (const char* fd = std::getenv("GEOLOCO_STATUS_FD"); launched && fd != nullptr && rank == 0) {
    o.status_fd = std::atoi(fd);
    o.progress = false;
  }
  auto summary = run_rank(cfg, o);
  if (cfg.global_rank(site, rank) == 0 && !launched) print_human_summary(cfg, summary);
}

struct LaunchArgs : WorkerArgs {
  bool plain = false;                   // --plain: prefixed lines only, even on a terminal
  int max_restarts = 3;                 // --max-restarts: a failed site's processes are started again with --join
  double restart_backoff_s = 1;         // --restart-backoff-s: the first wait, doubled per restart (at most 30 s)
  std::vector<std::string> only_sites;  // --site (repeatable): start only these sites' ranks here
  int node = -1;                        // --node I: only the ranks on that site's I-th node
};

// The status view needs a terminal on both outputs (lines and block share the screen).
bool wants_status_view(const LaunchArgs& a) {
  if (a.plain || !::isatty(1) || !::isatty(2)) return false;
  const char* term = std::getenv("TERM");
  return term != nullptr && std::string(term) != "dumb" && std::string(term) != "";
}

// One rank of a run.command run under `geoloco launch`: its program and environment; a restart
// adds GEOLOCO_JOIN=1 (it joins the running job, as `worker --join` does).
launch::ProcessSpec command_process(const trainer::RunConfig& cfg, const LaunchArgs& a, int site, int rank) {
  const auto& s = cfg.sites[static_cast<size_t>(site)];
  launch::ProcessSpec p;
  p.label = fmt::format("{}/{}", s.name, rank);
  p.group = s.name;
  p.argv = cfg.run.command;
  p.env = command_env(cfg, a, site, rank);
  p.restart_argv = p.argv;
  p.restart_env = {{"GEOLOCO_JOIN", "1"}, {"GEOLOCO_RESUME", "0"}};
  return p;
}

void run_launch(const LaunchArgs& a) {
  auto cfg = trainer::load_run_config(a.config, a.sets);
  if (cfg.external_inner_loop() && (a.stop_at > 0 || !a.capture_dir.empty()))
    throw InputError(
        fmt::format("{}: --stop-at-step and --capture-pseudograd drive geoloco's own inner loop; this run's is "
                    "run.command's",
                    a.config));
  const std::vector<LaunchRank> mine = select_launch_ranks(cfg, a.only_sites, a.node);
  if (cfg.world_size() == 1 && !cfg.external_inner_loop()) {
    WorkerArgs w = a;
    w.site = cfg.sites[0].name;
    w.rank = 0;
    run_worker(w);
    return;
  }
  const std::string exe = self_exe();
  std::vector<launch::ProcessSpec> procs;
  std::vector<std::string> local_sites;
  for (const auto& [site, r] : mine) {
    const auto& s = cfg.sites[static_cast<size_t>(site)];
    if (local_sites.empty() || local_sites.back() != s.name) local_sites.push_back(s.name);
    if (cfg.external_inner_loop()) {
      procs.push_back(command_process(cfg, a, site, r));
    } else {
      launch::ProcessSpec p;
      p.label = fmt::format("{}/{}", s.name, r);
      p.group = s.name;
      p.argv = {exe, "worker", a.config, "--site", s.name, "--rank", std::to_string(r)};
      for (const auto& kv : a.sets) {
        p.argv.push_back("--set");
        p.argv.push_back(kv);
      }
      if (a.resume) p.argv.push_back("--resume");
      if (a.stop_at > 0) {
        p.argv.push_back("--stop-at-step");
        p.argv.push_back(std::to_string(a.stop_at));
      }
      if (!a.capture_dir.empty()) {
        p.argv.push_back("--capture-pseudograd");
        p.argv.push_back(a.capture_dir);
      }
      if (!a.bind_address.empty()) {
        p.argv.push_back("--bind-address");
        p.argv.push_back(a.bind_address);
      }
      // A restart joins the running job from its peers (never --resume: the others went on).
      for (const auto& arg : p.argv)
        if (arg != "--resume") p.restart_argv.push_back(arg);
      p.restart_argv.push_back("--join");
      p.env = {{"GEOLOCO_LAUNCHED", "1"}, {"OMP_NUM_THREADS", std::to_string(cfg.train.threads)}};
      procs.push_back(std::move(p));
    }
  }
  const bool everything = static_cast<int>(procs.size()) == cfg.world_size();
  if (everything)
    fmt::print(stderr, "geoloco: launching {} ranks over {} sites ({})\n", procs.size(), cfg.sites.size(), a.config);
  else
    fmt::print(stderr, "geoloco: launching {} of the run's {} ranks here: {}{} ({}); the other sites start theirs\n",
               procs.size(), cfg.world_size(), fmt::join(local_sites, ", "),
               a.node >= 0 ? fmt::format(" node {}", a.node) : std::string(), a.config);
  launch::LaunchOptions lo;
  // A site is one failure domain: when the run can outlive a site (its quorum is below the
  // number of sites), a failed rank takes only its own site down.
  const int S = static_cast<int>(cfg.sites.size());
  lo.isolate_groups = S > 1 && cfg.outer.quorum(S) < S;
  // A failed site comes back with --join when the schedule lets a site join (docs/elastic.md).
  if (lo.isolate_groups && a.max_restarts > 0) {
    std::string off;
    if (!cfg.outer.allow_join) off = "outer.allow_join is false";
    if (off.empty()) {
      lo.max_restarts = a.max_restarts;
      lo.restart_backoff = std::chrono::milliseconds(static_cast<int64_t>(a.restart_backoff_s * 1000));
    } else {
      fmt::print(stderr, "geoloco: a failed site is not restarted: {}\n", off);
    }
  }
  if (wants_status_view(a))
    for (const auto& s : local_sites) lo.status_sites.push_back(s);
  int rc = launch::launch(procs, lo);
  if (rc != 0) throw ExitCode{rc};
  const auto path = std::filesystem::path(cfg.run.output_dir) / "summary.json";
  std::ifstream in(path);
  auto summary = nlohmann::json::parse(in, nullptr, false);
  if (summary.is_discarded()) {
    // The run's summary is written by the first site still in the run, at its rank 0: when
    // that one ran elsewhere, this machine has only its own sites' outputs.
    if (!everything) {
      fmt::print(stderr,
                 "geoloco: {} finished; the run's summary.json is written by the first site's rank 0, "
                 "in run.output_dir on its machine ({} here: sites/<site>/ per site)\n",
                 fmt::join(local_sites, ", "), cfg.run.output_dir);
      return;
    }
    throw Error(fmt::format("{}: missing or unreadable after the run", path.string()));
  }
  print_human_summary(cfg, summary);
}

void add_common(CLI::App* cmd, WorkerArgs& a) {
  cmd->add_option("config", a.config, "run config (YAML)")->required();
  cmd->add_option("--set", a.sets, "override a key: --set train.steps=100 (repeatable)");
  cmd->add_flag("--resume", a.resume, "continue from the newest checkpoints in run.output_dir");
  cmd->add_option("--stop-at-step", a.stop_at, "stop cleanly with a checkpoint after this step")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--capture-pseudograd", a.capture_dir,
                  "write every outer round's pseudo-gradient of each rank's shard to DIR as safetensors "
                  "(benchmarks: bench/compression/capture.sh)")
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--bind-address", a.bind_address,
                  "this node's IPv4 address, for the ranks of a site across nodes (sites[].nodes) beyond node 0 "
                  "(default: GEOLOCO_BIND_ADDRESS, else the interface that reaches the site's host)");
}

}  // namespace

void add_worker_commands(CLI::App& app) {
  {
    auto a = std::make_shared<WorkerArgs>();
    auto* cmd =
        app.add_subcommand("worker", "Run one rank of one site (under srun, site and rank come from SLURM_PROCID)");
    add_common(cmd, *a);
    cmd->add_option("--site", a->site, "site name from the config");
    cmd->add_option("--rank", a->rank, "rank within the site")->check(CLI::NonNegativeNumber);
    cmd->add_flag("--join", a->join,
                  "join the running job: fetch the committed state from the other sites (a restarted or new site; "
                  "docs/elastic.md)");
    cmd->callback([a] { run_worker(*a); });
  }
  {
    auto a = std::make_shared<LaunchArgs>();
    auto* cmd = app.add_subcommand("launch", "Run every rank of every site of a config on this machine");
    add_common(cmd, *a);
    cmd->add_flag("--plain", a->plain,
                  "plain prefixed lines even on a terminal (default there: a status block per site)");
    cmd->add_option("--max-restarts", a->max_restarts,
                    "when the run outlives a site: start a failed site's processes again with --join, at most N "
                    "times per site (0: never)")
        ->check(CLI::NonNegativeNumber)
        ->capture_default_str();
    cmd->add_option("--site", a->only_sites,
                    "start only this site's ranks here (repeatable): each campus launches its own part of the run");
    cmd->add_option("--node", a->node,
                    "with one --site whose ranks span nodes (sites[].nodes or sites[].hosts): only the ranks on its "
                    "I-th node (the I-th run of ranks, or the I-th distinct address in rank order)")
        ->check(CLI::NonNegativeNumber);
    cmd->add_option("--restart-backoff-s", a->restart_backoff_s,
                    "wait before a site's first restart, doubled for each further one (at most 30 s)")
        ->check(CLI::Range(0.0, 3600.0))
        ->capture_default_str();
    cmd->callback([a] { run_launch(*a); });
  }
}

}  // namespace geoloco::app

// geoloco worker (one rank) and geoloco launch (every rank of every site on this machine).
#include <fmt/format.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "outer_optimizer/diloco.hpp"
#include "trainer/app/commands.hpp"
#include "trainer/app/run_summary.hpp"
#include "trainer/core/error.hpp"
#include "trainer/core/log.hpp"
#include "trainer/launch/launcher.hpp"
#include "trainer/launch/slurm_env.hpp"
#include "trainer/loop/run_config.hpp"
#include "trainer/loop/trainer.hpp"
#include "trainer/parallel/gloo_collective.hpp"
#include "transport/transport.hpp"

namespace geoloco::app {

namespace {

constexpr uint64_t kSummaryRound = UINT64_MAX - 1;  // control round of the final summary exchange
constexpr size_t kMaxSummaryBytes = 16u << 20;

struct WorkerArgs {
  std::string config;
  std::vector<std::string> sets;
  std::string site;
  int rank = -1;
  bool resume = false;
  int64_t stop_at = 0;
};

std::string self_exe() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) throw Error("cannot resolve /proc/self/exe");
  return std::string(buf, static_cast<size_t>(n));
}

std::chrono::milliseconds rendezvous_timeout(const trainer::RunConfig& cfg) {
  double s = cfg.transport ? cfg.transport->connect_timeout_s : 60.0;
  return std::chrono::milliseconds(static_cast<int64_t>(s * 1000));
}

std::vector<uint8_t> to_bytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

// Totals over every rank of every site, for summary.json.
nlohmann::json run_totals(const trainer::RunConfig& cfg, const std::vector<nlohmann::json>& ranks) {
  nlohmann::json t;
  uint64_t sent = 0, received = 0;
  for (const auto& r : ranks) {
    sent += r.value("wan_bytes_sent", uint64_t{0});
    received += r.value("wan_bytes_received", uint64_t{0});
  }
  t["wan_bytes_sent_total"] = sent;
  t["wan_bytes_received_total"] = received;
  const uint64_t S = cfg.sites.size();
  if (S > 1) {
    // Per-step data parallelism across sites: a ring all-reduce of the fp32 gradient every
    // inner step; each site sends 2 (S-1)/S x 4N bytes per step, S sites together 2 (S-1) x 4N.
    const uint64_t steps = ranks.at(0).value("steps", uint64_t{0});
    t["ddp_equivalent_wan_bytes"] = steps * 2 * (S - 1) * 4 * static_cast<uint64_t>(cfg.model.num_params());
    if (sent > 0) t["wan_reduction_vs_ddp"] = double(t["ddp_equivalent_wan_bytes"].get<uint64_t>()) / double(sent);
  }
  return t;
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
  // Under `geoloco launch` the launcher already prefixes every line with [site/rank].
  log::init(std::getenv("GEOLOCO_LAUNCHED") ? "" : fmt::format("{}/{}", sc.name, rank), cfg.run.log_level);

  std::unique_ptr<parallel::Collective> coll;
  if (sc.ranks > 1) {
    parallel::RendezvousOptions ro;
    ro.site = sc.name;
    ro.rank = rank;
    ro.size = sc.ranks;
    ro.store_host = sc.host;
    ro.store_port = sc.port + sc.ranks;
    ro.bind_address = sc.host;
    ro.timeout = rendezvous_timeout(cfg);
    coll = parallel::make_gloo(ro);
  }
  std::unique_ptr<transport::Transport> tp;
  if (cfg.sites.size() > 1) {
    transport::Identity self{sc.name, rank, cfg.run.name, cfg.hash};
    std::vector<transport::PeerInfo> peers;
    for (const auto& s : cfg.sites)
      if (s.name != sc.name) peers.push_back({s.name, rank, s.host, s.port + rank});
    tp = std::make_unique<transport::Transport>(*cfg.transport, self);
    tp->start(sc.host, sc.port + rank, peers);
    spdlog::info("connected to {} peer site(s) over UCX", peers.size());
  }

  trainer::TrainerOptions opt;
  opt.site = site;
  opt.rank = rank;
  opt.resume = a.resume;
  opt.stop_at_step = a.stop_at;
  opt.collective = coll.get();
  trainer::Trainer trainer(cfg, opt);
  std::unique_ptr<outer::Diloco> diloco;
  if (cfg.outer.enabled) {
    diloco = std::make_unique<outer::Diloco>(cfg, site, rank, tp.get(), trainer.strategy());
    trainer.set_outer(diloco.get());
  }
  nlohmann::json mine = trainer.run();

  // Gather every rank's summary at global rank 0: within the site over the collective, then
  // each site's rank 0 sends its site's list to site 0's rank 0 over the transport.
  std::vector<nlohmann::json> site_list = {mine};
  if (coll) {
    std::string text = mine.dump();
    auto all = coll->all_gather_bytes(std::as_bytes(std::span<const char>(text.data(), text.size())));
    site_list.clear();
    for (auto& b : all) site_list.push_back(nlohmann::json::parse(std::string(reinterpret_cast<const char*>(b.data()), b.size())));
  }
  if (rank != 0) return;
  std::vector<nlohmann::json> everyone;
  if (tp) {
    // Shard 0 carries the summary, shard 1 site 0's acknowledgement: a site leaves only
    // once site 0 holds its summary (a closed peer cannot deliver anything afterwards).
    std::vector<uint8_t> ack(1, 1), ack_in(1);
    if (site != 0) {
      const int p0 = tp->peer_index(cfg.sites[0].name, 0);
      auto bytes = to_bytes(nlohmann::json(site_list).dump());
      auto got = tp->recv(p0, transport::FrameKind::kControl, kSummaryRound, 1, ack_in);
      tp->send(p0, transport::FrameKind::kControl, kSummaryRound, 0, bytes).wait();
      got.wait();
      return;
    }
    everyone = site_list;
    for (size_t s = 1; s < cfg.sites.size(); ++s) {
      const int p = tp->peer_index(cfg.sites[s].name, 0);
      std::vector<uint8_t> buf(kMaxSummaryBytes);
      auto h = tp->recv(p, transport::FrameKind::kControl, kSummaryRound, 0, buf);
      h.wait();
      tp->send(p, transport::FrameKind::kControl, kSummaryRound, 1, ack).wait();
      auto j = nlohmann::json::parse(std::string(buf.begin(), buf.begin() + static_cast<int64_t>(h.bytes())), nullptr, false);
      if (!j.is_array()) throw Error(fmt::format("site {} sent a malformed final summary", cfg.sites[s].name));
      for (auto& r : j) everyone.push_back(r);
    }
  } else {
    everyone = site_list;
  }
  auto summary = write_run_summary(cfg, everyone, run_totals(cfg, everyone));
  if (!std::getenv("GEOLOCO_LAUNCHED")) print_human_summary(cfg, summary);
}

struct LaunchArgs : WorkerArgs {};

void run_launch(const LaunchArgs& a) {
  auto cfg = trainer::load_run_config(a.config, a.sets);
  if (cfg.world_size() == 1) {
    WorkerArgs w = a;
    w.site = cfg.sites[0].name;
    w.rank = 0;
    run_worker(w);
    return;
  }
  const std::string exe = self_exe();
  std::vector<launch::ProcessSpec> procs;
  for (const auto& s : cfg.sites) {
    for (int r = 0; r < s.ranks; ++r) {
      launch::ProcessSpec p;
      p.label = fmt::format("{}/{}", s.name, r);
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
      p.env = {{"GEOLOCO_LAUNCHED", "1"}, {"OMP_NUM_THREADS", std::to_string(cfg.train.threads)}};
      procs.push_back(std::move(p));
    }
  }
  fmt::print(stderr, "geoloco: launching {} ranks over {} sites ({})\n", procs.size(), cfg.sites.size(), a.config);
  int rc = launch::launch(procs);
  if (rc != 0) throw ExitCode{rc};
  const auto path = std::filesystem::path(cfg.run.output_dir) / "summary.json";
  std::ifstream in(path);
  auto summary = nlohmann::json::parse(in, nullptr, false);
  if (summary.is_discarded()) throw Error(fmt::format("{}: missing or unreadable after the run", path.string()));
  print_human_summary(cfg, summary);
}

void add_common(CLI::App* cmd, WorkerArgs& a) {
  cmd->add_option("config", a.config, "run config (YAML)")->required();
  cmd->add_option("--set", a.sets, "override a key: --set train.steps=100 (repeatable)");
  cmd->add_flag("--resume", a.resume, "continue from the newest checkpoints in run.output_dir");
  cmd->add_option("--stop-at-step", a.stop_at, "stop cleanly with a checkpoint after this step")->check(CLI::NonNegativeNumber);
}

}  // namespace

void add_worker_commands(CLI::App& app) {
  {
    auto a = std::make_shared<WorkerArgs>();
    auto* cmd = app.add_subcommand("worker", "Run one rank of one site (under srun, site and rank come from SLURM_PROCID)");
    add_common(cmd, *a);
    cmd->add_option("--site", a->site, "site name from the config");
    cmd->add_option("--rank", a->rank, "rank within the site")->check(CLI::NonNegativeNumber);
    cmd->callback([a] { run_worker(*a); });
  }
  {
    auto a = std::make_shared<LaunchArgs>();
    auto* cmd = app.add_subcommand("launch", "Run every rank of every site of a config on this machine");
    add_common(cmd, *a);
    cmd->callback([a] { run_launch(*a); });
  }
}

}  // namespace geoloco::app

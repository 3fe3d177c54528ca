// One rank end to end: its site collective, its transport to the other sites, the trainer, the
// outer loop built at the edge from the run config, and the run summary gathered (rank_runner.hpp).
#include "trainer/app/rank_runner.hpp"

#include <algorithm>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <memory>

#include "outer_optimizer/diloco.hpp"
#include "trainer/app/rank_address.hpp"
#include "trainer/app/run_summary.hpp"
#include "core/error.hpp"
#include "trainer/loop/device_site.hpp"
#include "trainer/loop/outer_edge.hpp"
#include "trainer/loop/trainer.hpp"
#include "trainer/loop/strategy_choice.hpp"
#include "trainer/parallel/gloo_collective.hpp"
#include "trainer/parallel/nccl_collective.hpp"
#include "transport/ucx/ucx_transport.hpp"

namespace geoloco::app {

namespace {

constexpr uint64_t kSummaryRound = UINT64_MAX - 1;  // control round of the final summary exchange
constexpr size_t kMaxSummaryBytes = 16u << 20;

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
    // The model's size: the ranks' own count (a program's model under run.command), else the config's.
    const auto params = ranks.at(0).value("params", static_cast<uint64_t>(cfg.model.num_params()));
    t["ddp_equivalent_wan_bytes"] = steps * 2 * (S - 1) * 4 * params;
    if (sent > 0) t["wan_reduction_vs_ddp"] = double(t["ddp_equivalent_wan_bytes"].get<uint64_t>()) / double(sent);
  }
  return t;
}

// Peers at a site whose ranks found their addresses (beyond its node 0): asked of that site's
// rank 0 (its gate, at the configured host and port), one request per site. A joiner whose
// request fails (that site is gone) keeps the configured host: its dial fails as unreachable
// and the join goes on without that site.
void resolve_peer_addresses(const trainer::RunConfig& cfg, const transport::ucx::UcxTransport& ucx,
                            std::vector<transport::PeerInfo>& peers, bool join) {
  for (const auto& other : cfg.sites) {
    if (!other.finds_addresses()) continue;
    bool needed = false;
    for (const auto& p : peers) needed = needed || (p.site == other.name && other.node_of(p.rank) > 0);
    if (!needed) continue;
    std::vector<std::string> dir;
    try {
      // A joiner does not wait long for a site that may be gone (as its dials do).
      const double wait = join ? std::min(transport::kJoinUnreachableS, cfg.transport->connect_timeout_s / 2) : 0;
      dir = ucx.site_directory({other.name, 0, other.host, other.port}, other.ranks, wait);
    } catch (const transport::TransportError& e) {
      if (!join) throw;
      spdlog::warn("site {}'s directory: {}; its ranks beyond node 0 are dialed at {}", other.name, e.what(),
                   other.host);
      continue;
    }
    for (auto& p : peers)
      if (p.site == other.name) p.host = dir.at(static_cast<size_t>(p.rank));
    spdlog::debug("site {}'s directory: {}", other.name, fmt::join(dir, ", "));
  }
}

}  // namespace

planner::HostTopologyOptions host_topology_from_env() {
  planner::HostTopologyOptions o;
  if (const char* smi = std::getenv("GEOLOCO_NVIDIA_SMI"); smi != nullptr && *smi != '\0') o.nvidia_smi = smi;
  return o;
}

std::unique_ptr<transport::Transport> connect_site_transport(const trainer::RunConfig& cfg, int site, int rank,
                                                             int64_t param_count, const std::string& address,
                                                             const std::vector<std::string>& site_addresses, bool join,
                                                             const RankOptions::ConnectTransport& connect) {
  const auto& sc = cfg.sites.at(static_cast<size_t>(site));
  std::unique_ptr<transport::Transport> tp;
  if (cfg.sites.size() > 1) {
    transport::Identity self{sc.name, rank, cfg.run.name, cfg.hash};
    std::vector<transport::PeerInfo> peers;
    // The ranks of the other sites this rank exchanges with (its rank when every site has
    // the same rank count; outer_optimizer/exchange_layout.hpp otherwise).
    const outer::ExchangeLayout layout = outer::SitePeers::layout_of(trainer::outer_sites(cfg), param_count);
    for (size_t s = 0; s < cfg.sites.size(); ++s) {
      if (static_cast<int>(s) == site) continue;
      const auto& other = cfg.sites[s];
      for (int q : outer::SitePeers::connected_ranks(layout, site, rank, static_cast<int>(s)))
        peers.push_back({other.name, q, other.host_of(q), other.port + q});
    }
    const auto mode = join ? transport::ConnectMode::kJoin : transport::ConnectMode::kAll;
    if (connect) {
      tp = connect(self, peers, mode);
    } else {
      auto ucx = std::make_unique<transport::ucx::UcxTransport>(*cfg.transport, self);
      ucx->listen(address, sc.port + rank);
      if (rank == 0 && !site_addresses.empty()) ucx->set_directory(site_addresses);
      resolve_peer_addresses(cfg, *ucx, peers, join);
      ucx->connect(peers, mode);
      tp = std::move(ucx);
      spdlog::info("connected to {} peer site(s) over UCX", peers.size());
    }
  }
  return tp;
}

nlohmann::json finish_run_summary(const trainer::RunConfig& cfg, int site, int rank, const SiteGather& in_site,
                                  transport::Transport* tp, uint64_t members, const nlohmann::json& mine) {
  // Gather every rank's summary at global rank 0: within the site over the collective, then
  // each site's rank 0 sends its site's list to site 0's rank 0 over the transport.
  std::vector<nlohmann::json> site_list = {mine};
  if (in_site) {
    std::string text = mine.dump();
    auto all = in_site(std::as_bytes(std::span<const char>(text.data(), text.size())));
    site_list.clear();
    for (auto& b : all)
      site_list.push_back(nlohmann::json::parse(std::string(reinterpret_cast<const char*>(b.data()), b.size())));
  }
  if (rank != 0) return mine;
  std::vector<nlohmann::json> everyone;
  if (tp) {
    // The sites still in the run (the last round's members) send their summaries to the
    // first of them: no site's loss, the first's included, leaves the summary unwritten.
    // Shard 0 carries the summary, shard 1 the collector's acknowledgement: a site leaves
    // only once the collector holds its summary (a closed peer delivers nothing afterwards).
    size_t collector = 0;
    while (collector < cfg.sites.size() && !((members >> collector) & 1)) ++collector;
    const auto ack = transport::make_payload({1});
    if (static_cast<size_t>(site) != collector) {
      const int p0 = tp->peer_index(cfg.sites[collector].name, 0);
      auto got = tp->recv(p0, transport::FrameKind::kControl, kSummaryRound, 1, size_t{1});
      tp->send(p0, transport::FrameKind::kControl, kSummaryRound, 0,
               transport::make_payload(to_bytes(nlohmann::json(site_list).dump())))
          .wait();
      got.wait();
      return mine;
    }
    everyone = site_list;
    for (size_t s = 0; s < cfg.sites.size(); ++s) {
      if (s == collector || !((members >> s) & 1)) continue;
      const int p = tp->peer_index(cfg.sites[s].name, 0);
      auto h = tp->recv(p, transport::FrameKind::kControl, kSummaryRound, 0, kMaxSummaryBytes);
      h.wait();
      tp->send(p, transport::FrameKind::kControl, kSummaryRound, 1, ack).wait();
      const auto buf = h.take();
      auto j = nlohmann::json::parse(std::string(buf.begin(), buf.begin() + static_cast<int64_t>(h.bytes())), nullptr,
                                     false);
      if (!j.is_array()) throw Error(fmt::format("site {} sent a malformed final summary", cfg.sites[s].name));
      for (auto& r : j) everyone.push_back(r);
    }
  } else {
    everyone = site_list;
  }
  return write_run_summary(cfg, everyone, run_totals(cfg, everyone));
}

nlohmann::json run_rank(const trainer::RunConfig& given, const RankOptions& o) {
  const int site = o.site, rank = o.rank;
  const auto& sc = given.sites.at(static_cast<size_t>(site));
  // site.device: cuda: the rank's GPU first (NCCL binds to it), with one clear error naming
  // the rank when there is none.
  const bool on_gpu = sc.device == "cuda";
  const int gpu = on_gpu ? trainer::select_rank_device(given, site, rank, o.cuda_device) : -1;
  // Where this rank listens (rank_address.hpp): the config's address, or one it found.
  const std::string address = rank_address(sc, rank, o.bind_address);
  std::unique_ptr<parallel::Collective> coll;
  if (sc.ranks > 1) {
    parallel::RendezvousOptions ro;
    ro.site = sc.name;
    ro.rank = rank;
    ro.size = sc.ranks;
    ro.store_host = sc.host;
    ro.store_port = sc.port + sc.ranks;
    ro.bind_address = address;
    ro.timeout = rendezvous_timeout(given);
    // A round's membership vote: the site's ranks wait for their leader's consensus, which may
    // wait up to outer.quorum_wait_s below quorum.
    if (given.sites.size() > 1)
      ro.timeout =
          std::max(ro.timeout, std::chrono::milliseconds(static_cast<int64_t>(
                                   (given.outer.quorum_wait_s + given.outer.consensus_retry_s * 8 + 10) * 1000)));
    ro.cuda_device = gpu;
    coll = on_gpu ? parallel::make_nccl(ro) : parallel::make_gloo(ro);
  }
  // site.strategy: auto on a cuda site without topology.file: chosen now from this host's
  // nvidia-smi topo -m, the same on every rank of the site (a copy of the config carries it).
  const trainer::RunConfig cfg = trainer::choose_strategy_at_start(given, site, rank, coll.get(), o.host_topology);
  // A site whose ranks found their addresses: every rank learns all of them (rank 0's gate
  // serves them to the other sites).
  std::vector<std::string> site_addresses;
  if (sc.finds_addresses() && coll) {
    for (const auto& b : coll->all_gather_bytes(std::as_bytes(std::span<const char>(address.data(), address.size()))))
      site_addresses.emplace_back(reinterpret_cast<const char*>(b.data()), b.size());
    if (rank == 0)
      spdlog::info("site {}: {} ranks on {} nodes at {}", sc.name, sc.ranks, sc.nodes, fmt::join(site_addresses, ", "));
  }
  std::unique_ptr<transport::Transport> tp = connect_site_transport(
      cfg, site, rank, trainer::ParamLayout(cfg.model).total(), address, site_addresses, o.join, o.connect_transport);

  trainer::TrainerOptions opt;
  opt.site = site;
  opt.rank = rank;
  opt.resume = o.resume;
  opt.join = o.join;
  opt.stop_at_step = o.stop_at_step;
  opt.progress = o.progress;
  opt.status_fd = o.status_fd;
  opt.collective = coll.get();
  opt.cuda_device = gpu;
  trainer::Trainer trainer(cfg, opt);
  std::unique_ptr<outer::Diloco> diloco;
  if (cfg.outer.enabled) {
    diloco = std::make_unique<outer::Diloco>(trainer::outer_options(cfg, site, rank, o.outer_hooks, o.join), tp.get(),
                                             trainer.site());
    trainer.set_outer(diloco.get());
  }
  nlohmann::json mine = trainer.run();
  mine["address"] = address;  // where this rank listened (configured, given or found)

  // Gather every rank's summary at global rank 0.
  SiteGather in_site;
  if (coll) in_site = [&](std::span<const std::byte> mine_bytes) { return coll->all_gather_bytes(mine_bytes); };
  return finish_run_summary(cfg, site, rank, in_site, tp.get(), diloco ? diloco->members() : ~uint64_t{0}, mine);
}

}  // namespace geoloco::app

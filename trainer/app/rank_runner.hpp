// One rank, end to end: the site's collective (Gloo rendezvous), the UCX transport to the
// same rank of every other site, the inner loop, the DiLoCo outer loop, and at the end the
// run-level summary.json gathered at global rank 0. `geoloco worker` and `geoloco launch`
// (and the multi-site tests, with ranks as threads) all run ranks through this.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "outer_optimizer/outer_hooks.hpp"
#include "planner/host_topology.hpp"
#include "trainer/loop/run_config.hpp"
#include "transport/transport.hpp"

namespace geoloco::app {

struct RankOptions {
  int site = 0;
  int rank = 0;
  bool resume = false;
  // Join the running job from the other sites (a restarted or new site): the transport
  // connects in ConnectMode::kJoin, the outer loop fetches the committed state (outer::Diloco::join).
  bool join = false;
  int64_t stop_at_step = 0;
  bool progress = true;
  int status_fd = -1;  // the launcher's status pipe (TrainerOptions::status_fd)
  // site.device: cuda: pin this rank to a GPU (tests); -1 selects it from the local rank.
  int cuda_device = -1;
  // How this rank reaches rank r of the other sites: a connected transport for (self,
  // peers). Default (empty): UCX, listening on the rank's address and port from the config.
  // Tests give the in-memory fabric's (transport/memory/).
  using ConnectTransport = std::function<std::unique_ptr<transport::Transport>(
      const transport::Identity& self, const std::vector<transport::PeerInfo>& peers, transport::ConnectMode mode)>;
  ConnectTransport connect_transport;
  // Injected into the outer loop (outer_optimizer/outer_hooks.hpp).
  outer::OuterHooks outer_hooks;
  // A rank of a site across nodes (sites[].nodes) beyond node 0: the address it binds
  // (--bind-address or GEOLOCO_BIND_ADDRESS); "" finds it (rank_address.hpp).
  std::string bind_address;
  // site.strategy: auto without topology.file: the nvidia-smi the site's rank 0 runs
  // (host_topology_from_env()).
  planner::HostTopologyOptions host_topology;
};

// The CLI's edge: GEOLOCO_NVIDIA_SMI, when set, names the nvidia-smi to run (a wrapper where it
// is not on PATH; tests give a script printing a fixture). Read here only; everything below
// gets it as RankOptions::host_topology.
planner::HostTopologyOptions host_topology_from_env();

// This rank's transport to the ranks of the other sites it exchanges with (null for a one-site
// run): UCX listening on `address` at the site's port + rank, or `connect` when given. The
// exchange layout depends on the model's parameter count (`param_count`). `site_addresses`:
// a site whose ranks found their addresses (rank 0 serves them); `join`: ConnectMode::kJoin.
std::unique_ptr<transport::Transport> connect_site_transport(const trainer::RunConfig& cfg, int site, int rank,
                                                             int64_t param_count, const std::string& address,
                                                             const std::vector<std::string>& site_addresses, bool join,
                                                             const RankOptions::ConnectTransport& connect = {});

// The site's all-gather of bytes in rank order (empty for a one-rank site).
using SiteGather = std::function<std::vector<std::vector<std::byte>>(std::span<const std::byte>)>;

// The end of a rank's run: every rank's summary gathered at the first site still in the run
// (`members`, the last round's) and written to summary.json there (write_run_summary); returns
// that summary at the collector's rank 0, `mine` elsewhere. Every rank of every member site
// calls it.
nlohmann::json finish_run_summary(const trainer::RunConfig& cfg, int site, int rank, const SiteGather& in_site,
                                  transport::Transport* tp, uint64_t members, const nlohmann::json& mine);

// Returns the run summary at global rank 0 (also written to summary.json), this rank's own
// summary elsewhere.
nlohmann::json run_rank(const trainer::RunConfig& cfg, const RankOptions& opts);

}  // namespace geoloco::app

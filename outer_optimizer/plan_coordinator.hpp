// PlanCoordinator: the protocol of outer.plan: auto between sites (auto_plan.hpp has the pure
// model). It decides; the outer loop (diloco.hpp) applies.
//
// Start-up: while the first plan_measure_steps inner steps are timed, rank 0 of every site
// probes every other site on a thread of its own (probe.hpp: RTT, one- and all-lanes
// throughput). Every site's rank 0 reports (its slowest rank's median step time, its worst
// path) to site 0's rank 0, which plans and sends the plan back; each site's rank 0 passes it
// to its ranks. Every rank returns the same bytes, so every rank applies the same plan.
//
// Period boundaries: each site's rank 0 reports the fragment sync and step times it measured;
// site 0 decides from the reports of the previous boundary (a drift beyond replan_threshold:
// re-plan with the model recalibrated to what was measured) and sends the decision, which
// every site applies at the next boundary. The messages travel one period ahead of their use,
// so the protocol costs no waiting; a checkpoint or a re-plan drains it (the same steps in an
// uninterrupted and a resumed run).
#pragma once

#include <cstdint>
#include <exception>
#include <optional>
#include <thread>
#include <vector>

#include "outer_optimizer/auto_plan.hpp"
#include "outer_optimizer/outer_hooks.hpp"
#include "outer_optimizer/site_peers.hpp"
#include "trainer/loop/run_config.hpp"
#include "trainer/loop/site_strategy.hpp"
#include "trainer/model/param_layout.hpp"

namespace geoloco::outer {

class PlanCoordinator {
 public:
  PlanCoordinator(const trainer::RunConfig& cfg, const SitePeers& peers, const trainer::ParamLayout& layout,
                  const OuterHooks& hooks);
  ~PlanCoordinator();
  PlanCoordinator(const PlanCoordinator&) = delete;
  PlanCoordinator& operator=(const PlanCoordinator&) = delete;

  // Rank 0: starts the probe of the other sites in the background (once).
  void start_probe();
  // The start-up plan from this rank's inner step times (the first left out), the same on
  // every rank of every site (epoch 1).
  PlanDecision initial(trainer::SiteStrategy& strategy, const std::vector<double>& step_times);
  // The protocol at a period boundary of `plan` (its epoch keys the messages). Returns a plan
  // with another schedule to apply now (the protocol is drained then); a recalibration of the
  // same schedule updates `plan` in place. `sync_times` / `step_times` are what this rank
  // measured since the last boundary.
  std::optional<PlanDecision> boundary(int64_t step, trainer::SiteStrategy& strategy, PlanDecision& plan,
                                       const std::vector<double>& sync_times, const std::vector<double>& step_times);
  // Waits for every message in flight and forgets the boundary state (checkpoint, re-plan, end).
  void drain();
  // The plan epoch starts over (a new schedule was applied).
  void restart() { boundary_ = 0; }

  int replans() const { return replans_; }
  int recalibrations() const { return recalibrations_; }
  void set_replans(int n) { replans_ = n; }

 private:
  PathMeasurement probe_sites();
  PlanRequest request(const PathMeasurement& path, double step_time_s, double capacity_scale) const;

  const trainer::RunConfig& cfg_;
  const OuterConfig& ocfg_;
  const SitePeers& peers_;
  const trainer::ParamLayout& layout_;
  const OuterHooks& hooks_;
  int64_t boundary_ = 0;                  // boundaries seen in this plan epoch
  std::optional<PlanDecision> next_due_;  // site 0: decided now, applied at the next boundary
  nlohmann::json own_report_;             // site 0: its own report of the previous boundary
  std::vector<std::pair<int, transport::RecvHandle>> report_recvs_, decision_recvs_;  // (site, receive)
  std::vector<transport::SendHandle> report_sends_, decision_sends_;
  int replans_ = 0, recalibrations_ = 0;
  std::thread probe_thread_;
  std::optional<PathMeasurement> probe_path_;
  std::exception_ptr probe_error_;
};

}  // namespace geoloco::outer

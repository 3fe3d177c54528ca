// PlanCoordinator: the protocol of outer.plan: auto between sites (auto_plan.hpp has the pure
// model). It decides; the outer loop (diloco.hpp) applies.
//
// Start-up: while the first plan_measure_steps inner steps are timed, rank 0 of every site
// probes every other site on a thread of its own (probe.hpp: RTT, one- and all-lanes
// throughput). Every site's rank 0 reports (its slowest rank's median step time, its worst
// path) to site 0's rank 0, which plans and sends the plan back; each site's rank 0 passes it
// to its ranks. Every rank returns the same bytes, so every rank applies the same plan. (Every
// site of the config takes part, as in the start-up hash check.)
//
// Period boundaries, with no coordinator (docs/planning.md, "Re-plans"): at each boundary
// every site's rank 0 measures its fragment sync and step times since the previous one, and
// attaches that report to every contribution it makes until the next (the pseudo-gradient
// envelope's attachment, envelope.hpp). A contribution is wholly in a round or wholly out, so
// when a round commits every member holds the reports of every member, and of no one else.
// The lowest-index member of the first committed round that carries its own report of the
// current boundary decides from the reports in that round (a drift beyond replan_threshold:
// a re-plan with the model recalibrated to what was measured) and attaches the decision to
// its next contributions; the first committed round that carries a decision for that boundary
// makes it due on every member, and every rank applies it at the next boundary. A site that
// dies, is evicted or joins changes who reports and who decides, never whether the members
// agree: they all read the same committed rounds. A decider lost before its decision
// committed costs that boundary's decision, nothing else.
#pragma once

#include <cstdint>
#include <exception>
#include <map>
#include <optional>
#include <thread>
#include <vector>

#include "outer_optimizer/auto_plan.hpp"
#include "outer_optimizer/membership.hpp"
#include "outer_optimizer/outer_options.hpp"
#include "outer_optimizer/site.hpp"
#include "outer_optimizer/site_peers.hpp"

namespace geoloco::outer {

class PlanCoordinator {
 public:
  PlanCoordinator(const OuterOptions& options, const SitePeers& peers);
  ~PlanCoordinator();
  PlanCoordinator(const PlanCoordinator&) = delete;
  PlanCoordinator& operator=(const PlanCoordinator&) = delete;

  // Rank 0: starts the probe of the other sites in the background (once).
  void start_probe();
  // The start-up plan from this rank's inner step times (the first left out), the same on
  // every rank of every site (epoch 1).
  PlanDecision initial(Site& site, const std::vector<double>& step_times);
  // Period boundary `index` (1, 2, ... within the epoch of `plan`), a collective: every rank
  // of the site at the same step. Returns a plan with another schedule to apply now; a
  // recalibration of the same schedule updates `plan` in place. `sync_times` / `step_times`
  // are what this rank measured since the last boundary.
  std::optional<PlanDecision> boundary(int64_t step, int64_t index, Site& site, PlanDecision& plan,
                                       const std::vector<double>& sync_times, const std::vector<double>& step_times);
  // Rank 0: what this site attaches to its next contribution (its report, its decision not
  // yet committed); empty on the other ranks and before the first boundary.
  std::vector<uint8_t> attachment() const;
  // Rank 0, after every committed round: `attachments` by site, the contributors' (in the
  // round's members); `plan`, the plan in force. May decide (this site the decider) and may
  // make a decision due.
  void committed(uint64_t round, const std::vector<std::vector<uint8_t>>& attachments, SiteMask contributors,
                 const PlanDecision& plan);
  // The plan epoch starts over (a new schedule was applied): its reports and decisions go.
  void restart();
  // The protocol's state, for a checkpoint (JSON text; rank 0's, "" elsewhere) and its restore.
  // `shared`: only what every member knows (the decision due), the same bytes on every donor
  // of a join (their manifests must agree); a joiner restores that (`joining`), never a
  // donor's own report or decision.
  std::string save(bool shared = false) const;
  void restore(const std::string& text, const std::string& source, bool joining);

  int replans() const { return replans_; }
  int recalibrations() const { return recalibrations_; }
  void set_replans(int n) { replans_ = n; }

 private:
  PathMeasurement probe_sites();
  PlanRequest request(const PathMeasurement& path, double step_time_s, double capacity_scale,
                      const std::map<int, double>& local_sync_s) const;
  // The decider's choice from the reports of boundary `index` (none: keep the plan).
  std::optional<PlanDecision> decide(const std::vector<nlohmann::json>& reports, int64_t index,
                                     const PlanDecision& plan) const;

  // What rank 0 attaches and has learnt (all of one plan epoch).
  // Their JSON form is the same in attachments and checkpoints; from_json throws
  // nlohmann::json::exception (a missing or mistyped field) or Error (a bad plan, naming `source`).
  struct Report {
    int64_t epoch = 0, boundary = 0;
    double sync_s = 0, step_s = 0;
    bool drift = false;
    nlohmann::json to_json() const;
    static Report from_json(const nlohmann::json& j);
  };
  struct Decided {
    int64_t epoch = 0, boundary = 0;
    PlanDecision plan;  // another schedule, or the same one recalibrated
    nlohmann::json to_json() const;
    static Decided from_json(const nlohmann::json& j, const std::string& source);
  };

  const OuterOptions& opt_;
  const OuterConfig& ocfg_;
  const SitePeers& peers_;
  const OuterHooks& hooks_;
  std::optional<Report> report_;     // this site's report of the latest boundary (attached)
  std::optional<Decided> decision_;  // this site's decision, attached until a round commits one
  std::optional<Decided> due_;       // committed: applied at the next boundary
  int64_t committed_boundary_ = 0;   // the latest boundary a committed decision answered
  int64_t decided_boundary_ = 0;     // the latest boundary this site decided for
  int replans_ = 0, recalibrations_ = 0;
  std::thread probe_thread_;
  std::optional<PathMeasurement> probe_path_;
  std::exception_ptr probe_error_;
};

}  // namespace geoloco::outer

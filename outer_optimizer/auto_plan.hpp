// outer.plan: auto -- the outer loop sized against what was measured.
//
// At start-up (after `plan_measure_steps` inner steps, before any sync) rank 0 of every site
// probes every other site (transport/probe: RTT, one-connection and all-lanes throughput), every
// rank times its inner steps, and site 0 turns the worst path and the slowest site's step
// time into a plan with the budget model (planner): the smallest H, and the fragment
// count and bit width, that reach `outer.target_utilization` (ties prefer more bits, then
// fewer fragments), with the run's overlap (tau) and the transport's lanes; under
// outer.exchange: auto also the exchange (all_to_all or owner; ties prefer all_to_all: one
// round, one quantization). Site 0 sends the
// plan to every site, each site's rank 0 to its ranks: every rank applies the same plan.
//
// During the run each site's rank 0 compares, once per period, the measured fragment sync
// time and step time with the plan's prediction. A drift beyond `replan_threshold` makes
// site 0 re-plan with the model recalibrated to what was measured (the WAN rate scaled so the
// model predicts the measured sync time); a plan with another schedule (H, F or codec) is
// applied by every rank at the same period boundary. The messages travel one period ahead of
// their use, so the protocol costs no waiting (AutoPlanProtocol in diloco.cpp).
//
// This file holds the pure parts: the decision, its wire form, the recalibration, the drift
// test. tests/outer_optimizer/test_auto_plan.cpp pins them.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "compression/config.hpp"
#include "outer_optimizer/outer_config.hpp"

namespace geoloco::outer {

// The path between two sites as the probe measured it (the worst pair for a run).
struct PathMeasurement {
  double rtt_s = 0, rtt_p99_s = 0;
  double per_connection_Bps = 0;  // one connection
  double path_Bps = 0;            // all lanes together
  int connections = 1;            // lanes used for path_Bps
  nlohmann::json to_json() const;
  static PathMeasurement from_json(const nlohmann::json& j);
  // Component-wise worst of two paths (largest RTT, smallest throughputs).
  static PathMeasurement worst(const PathMeasurement& a, const PathMeasurement& b);
};

struct PlanRequest {
  double params = 0;
  int sites = 2;
  int ranks = 1;  // ranks per site: concurrent connections per site pair
  int transport_lanes = 1;
  double eager_bytes = 8.0 * (1 << 20);  // transport.eager_bytes (budget: latency per round)
  double rtts_per_round = -1;            // < 0: from eager_bytes; transport.emulate: 0.5 (no TCP handshakes)
  int n_layer = 1;                       // fragments <= n_layer
  PathMeasurement path;
  double step_time_s = 0;       // slowest site's inner step
  double capacity_scale = 1.0;  // recalibration: measured / modelled WAN rate
  // The outer loop's own time per sync of a rank's shard, by bit width (local_cost.hpp; the
  // slowest rank of the slowest site); empty: not modelled.
  std::map<int, double> local_sync_s;
  const OuterConfig* outer = nullptr;  // tau, delayed update, target, H range, bits, block
};

struct PlanDecision {
  int64_t epoch = 0;     // 0: the config's own schedule; 1: the start-up plan; then re-plans
  int64_t interval = 0;  // H
  int fragments = 1;
  int bits = 32;
  std::string codec = "fp32";
  int lanes = 1;
  ExchangeKind exchange = ExchangeKind::AllToAll;  // AllToAll | Owner (outer.exchange; auto: the plan's choice)
  double step_time_s = 0;
  double predicted_fragment_sync_s = 0;
  double predicted_utilization = 0;
  double capacity_scale = 1.0;
  bool target_met = false;
  std::string reason;  // one paragraph: inputs, choice, why
  PathMeasurement path;
  std::map<int, double> local_sync_s;  // what the plan was made with (PlanRequest), kept for re-plans

  bool same_schedule(const PlanDecision& o) const {
    return interval == o.interval && fragments == o.fragments && codec == o.codec && exchange == o.exchange;
  }
  nlohmann::json to_json() const;
  // Throws Error naming `source` for anything missing or out of range.
  static PlanDecision from_json(const nlohmann::json& j, const std::string& source);
};

// The codec name for a bit width: 32 fp32, 16 fp16, 8 int8, 4 int4, 2 int2.
std::string codec_for_bits(int bits);

// The budget model's answer for `req` (pure: the same inputs give the same plan).
PlanDecision choose_plan(const PlanRequest& req);

// The capacity scale that makes the model predict `measured_fragment_sync_s` for `plan`
// under `req` (bandwidth term only; the latency term stays what the RTT says). Clamped to
// [1e-3, 1e3].
double calibrated_capacity_scale(const PlanRequest& req, const PlanDecision& plan, double measured_fragment_sync_s);

// |measured / predicted - 1| > threshold (false when either is not positive).
bool drifted(double predicted, double measured, double threshold);

// The outer config's compression with the plan's codec (block, error feedback, zstd kept;
// error feedback switched on below 16 bits).
compression::PipelineConfig plan_compression(const compression::PipelineConfig& base, const PlanDecision& plan);

}  // namespace geoloco::outer

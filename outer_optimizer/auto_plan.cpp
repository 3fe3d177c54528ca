// outer.plan: auto, the pure parts: the decision, its wire form, recalibration, drift (auto_plan.hpp).
#include "outer_optimizer/auto_plan.hpp"

#include "planner/quality_floor.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "planner/budget.hpp"
#include "core/error.hpp"

namespace geoloco::outer {

nlohmann::json PathMeasurement::to_json() const {
  return {{"rtt_s", rtt_s},
          {"rtt_p99_s", rtt_p99_s},
          {"per_connection_Bps", per_connection_Bps},
          {"path_Bps", path_Bps},
          {"connections", connections}};
}

PathMeasurement PathMeasurement::from_json(const nlohmann::json& j) {
  PathMeasurement p;
  p.rtt_s = j.at("rtt_s").get<double>();
  p.rtt_p99_s = j.at("rtt_p99_s").get<double>();
  p.per_connection_Bps = j.at("per_connection_Bps").get<double>();
  p.path_Bps = j.at("path_Bps").get<double>();
  p.connections = j.at("connections").get<int>();
  return p;
}

PathMeasurement PathMeasurement::worst(const PathMeasurement& a, const PathMeasurement& b) {
  PathMeasurement w;
  w.rtt_s = std::max(a.rtt_s, b.rtt_s);
  w.rtt_p99_s = std::max(a.rtt_p99_s, b.rtt_p99_s);
  w.per_connection_Bps = std::min(a.per_connection_Bps, b.per_connection_Bps);
  w.path_Bps = std::min(a.path_Bps, b.path_Bps);
  w.connections = std::min(a.connections, b.connections);
  return w;
}

namespace {
// {"4": seconds, ...}: JSON keys are strings.
nlohmann::json local_json(const std::map<int, double>& m) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [b, s] : m) j[std::to_string(b)] = s;
  return j;
}
}  // namespace

nlohmann::json PlanDecision::to_json() const {
  return {{"epoch", epoch},
          {"interval", interval},
          {"fragments", fragments},
          {"bits", bits},
          {"codec", codec},
          {"lanes", lanes},
          {"exchange", name(exchange)},
          {"step_time_s", step_time_s},
          {"predicted_fragment_sync_s", predicted_fragment_sync_s},
          {"predicted_utilization", predicted_utilization},
          {"capacity_scale", capacity_scale},
          {"target_met", target_met},
          {"reason", reason},
          {"path", path.to_json()},
          {"local_sync_s", local_json(local_sync_s)}};
}

PlanDecision PlanDecision::from_json(const nlohmann::json& j, const std::string& source) {
  try {
    PlanDecision d;
    d.epoch = j.at("epoch").get<int64_t>();
    d.interval = j.at("interval").get<int64_t>();
    d.fragments = j.at("fragments").get<int>();
    d.bits = j.at("bits").get<int>();
    d.codec = j.at("codec").get<std::string>();
    d.lanes = j.at("lanes").get<int>();
    if (j.contains("exchange")) {  // absent before the owner exchange
      const std::string e = j.at("exchange").get<std::string>();
      if (e != name(ExchangeKind::AllToAll) && e != name(ExchangeKind::Owner))
        throw Error(fmt::format("exchange '{}' is neither all_to_all nor owner", e));
      d.exchange = e == name(ExchangeKind::Owner) ? ExchangeKind::Owner : ExchangeKind::AllToAll;
    }
    d.step_time_s = j.at("step_time_s").get<double>();
    d.predicted_fragment_sync_s = j.at("predicted_fragment_sync_s").get<double>();
    d.predicted_utilization = j.at("predicted_utilization").get<double>();
    d.capacity_scale = j.at("capacity_scale").get<double>();
    d.target_met = j.at("target_met").get<bool>();
    d.reason = j.at("reason").get<std::string>();
    d.path = PathMeasurement::from_json(j.at("path"));
    if (j.contains("local_sync_s"))  // absent in plans written before it was measured
      for (const auto& [k, v] : j.at("local_sync_s").items()) {
        int b = 0;
        for (int w : {2, 4, 8, 16, 32})
          if (k == std::to_string(w)) b = w;
        const double sec = v.get<double>();
        if (b == 0 || !(sec >= 0) || !std::isfinite(sec)) throw Error("local_sync_s out of range");
        d.local_sync_s[b] = sec;
      }
    if (d.epoch < 0 || d.interval < 1 || d.fragments < 1 || d.fragments > d.interval || d.lanes < 1 ||
        !compression::codec_from_name(d.codec))
      throw Error("values out of range");
    return d;
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("outer plan from {}: malformed: {}", source, e.what()));
  } catch (const Error& e) {
    throw Error(fmt::format("outer plan from {}: {}", source, e.what()));
  }
}

std::string codec_for_bits(int bits) {
  switch (bits) {
    case 32: return "fp32";
    case 16: return "fp16";
    case 8: return "int8";
    case 4: return "int4";
    case 2: return "int2";
    default: throw Error(fmt::format("no codec with {} bits per value", bits));
  }
}

namespace {

planner::BudgetInput budget_input(const PlanRequest& req) {
  const OuterConfig& o = *req.outer;
  planner::BudgetInput in;
  in.params = req.params;
  in.params_source = "model";
  in.block = o.compression.block;
  in.sites = req.sites;
  in.rtt_s = req.path.rtt_s;
  in.rtt_p99_s = req.path.rtt_p99_s;
  in.rtt_source = "probe";
  const double scale = req.capacity_scale;
  in.link_gbps = req.path.path_Bps * scale * 8 / 1e9;
  in.parallel_links = 1;
  in.measured_per_connection_Bps = req.path.per_connection_Bps * scale;
  in.measured_path_Bps = req.path.path_Bps * scale;
  in.measured_connections = req.path.connections;
  in.step_time_s = req.step_time_s;
  in.step_time_source = "measured";
  in.local_sync_s_by_bits = req.local_sync_s;
  // The weight-hash check is verified a round later, off the sync path: no latency term.
  in.check_rtts = 0.0;
  in.eager_bytes = req.eager_bytes;
  in.rtts_per_round = req.rtts_per_round;
  in.overlap_steps = o.delayed_update ? o.plan_h_min : o.overlap_steps;
  in.ranks = req.ranks;
  in.lanes = req.transport_lanes;
  in.target_utilization = o.target_utilization;
  // The quality floor: plan_h_min, raised when the outer lr is too large for a small H
  // (planner/quality_floor.hpp).
  in.h_floor = std::max<int64_t>(planner::quality_h_floor(o.plan_h_min, name(o.optimizer.kind), o.optimizer.lr),
                                 o.overlap_steps + 1);
  in.h_max = o.plan_h_max;
  in.search_bits = o.plan_bits;
  in.search_fragments.clear();
  for (int f : {1, 2, 4, 8, 16})
    if (f <= req.n_layer) in.search_fragments.push_back(f);
  // Lanes: the fewest of the transport's connections (1, 2, 4, ... and all of them) that
  // reach the target at the smallest H; the transport spreads chunks over that many.
  in.search_lanes.clear();
  for (int l = 1; l < req.transport_lanes; l *= 2) in.search_lanes.push_back(l);
  in.search_lanes.push_back(std::max(1, req.transport_lanes));
  in.H = in.h_floor;
  in.fragments = 1;
  in.bits = o.plan_bits.front();
  in.pattern = o.owner_exchange() ? planner::Pattern::Owner : planner::Pattern::AllToAll;
  if (o.exchange_auto()) in.search_patterns = {planner::Pattern::AllToAll, planner::Pattern::Owner};
  return in;
}

}  // namespace

PlanDecision choose_plan(const PlanRequest& req) {
  if (!req.outer) throw Error("choose_plan: no outer config");
  if (!(req.step_time_s > 0))
    throw Error(fmt::format("outer plan: measured step time {} s is not positive", req.step_time_s));
  if (!(req.path.path_Bps > 0) || !(req.path.per_connection_Bps > 0))
    throw Error("outer plan: the probe measured no throughput");
  const OuterConfig& o = *req.outer;
  const planner::BudgetInput in = budget_input(req);
  const planner::HSearch s = planner::smallest_h(in);
  const planner::Evaluation& e = s.best;
  PlanDecision d;
  d.interval = std::max<int64_t>(e.H, o.overlap_steps + 1);
  d.fragments = e.fragments;
  d.bits = e.bits;
  d.codec = codec_for_bits(e.bits);
  d.lanes = e.lanes;
  d.exchange = e.pattern == planner::Pattern::Owner ? ExchangeKind::Owner : ExchangeKind::AllToAll;
  d.step_time_s = req.step_time_s;
  d.predicted_fragment_sync_s = e.fragment_sync.total_s;
  d.predicted_utilization = e.utilization;
  d.capacity_scale = req.capacity_scale;
  d.target_met = s.found;
  d.path = req.path;
  d.local_sync_s = req.local_sync_s;
  // What more lanes would buy, for the reason (the transport's lanes are fixed at start-up).
  std::string lanes_note;
  if (!s.found || e.H > in.h_floor) {
    planner::BudgetInput more = in;
    more.search_lanes = {std::max(1, req.transport_lanes) * 4};
    const planner::HSearch m = planner::smallest_h(more);
    if (m.found && (!s.found || m.best.H < e.H))
      lanes_note =
          fmt::format(" With transport.lanes: {} the same target would need H = {}.", more.search_lanes[0], m.best.H);
  }
  std::string local;
  for (const auto& [b, sec] : req.local_sync_s)
    local += fmt::format("{}{} bits {:.0f} ms", local.empty() ? ", the outer loop's own time per sync (" : ", ", b,
                         sec * 1e3);
  if (!local.empty()) local += ")";
  d.reason = fmt::format(
      "Measured: RTT {:.2f} ms (p99 {:.2f} ms), {:.0f} Mbit/s on one connection, {:.0f} Mbit/s on {} lanes{}, inner "
      "step "
      "{:.1f} ms (slowest site){}, {:.3g}M parameters, {} sites x {} ranks. Chose H = {}, {} fragment(s), {} ({} "
      "bits), "
      "{} lane(s), exchange {}{}, overlap {} steps: one fragment sync is predicted at {:.1f} ms against {:.1f} ms of "
      "compute per period, utilization {:.4f} {} target {:.3f}{}.{}",
      req.path.rtt_s * 1e3, req.path.rtt_p99_s * 1e3, req.path.per_connection_Bps * 8 / 1e6,
      req.path.path_Bps * 8 / 1e6, req.path.connections,
      req.capacity_scale != 1.0 ? fmt::format(" (recalibrated x{:.3f} to the measured syncs)", req.capacity_scale) : "",
      req.step_time_s * 1e3, local, req.params / 1e6, req.sites, req.ranks, d.interval, d.fragments, d.codec, d.bits,
      d.lanes, name(d.exchange), o.exchange_auto() ? " (outer.exchange: auto)" : "",
      o.delayed_update ? "H (delayed update)" : std::to_string(o.overlap_steps), d.predicted_fragment_sync_s * 1e3,
      double(d.interval) * req.step_time_s * 1e3, d.predicted_utilization, s.found ? ">=" : "<", o.target_utilization,
      s.found ? " (the smallest H that reaches it; more bits preferred at equal H)" : fmt::format(" ({})", s.reason),
      lanes_note);
  return d;
}

double calibrated_capacity_scale(const PlanRequest& req, const PlanDecision& plan, double measured_s) {
  planner::BudgetInput in = budget_input(req);
  in.pattern = plan.exchange == ExchangeKind::Owner ? planner::Pattern::Owner : planner::Pattern::AllToAll;
  const double bpv = in.bytes_per_value_for_bits(plan.bits);
  const planner::SyncCost c = planner::sync_cost(in, bpv, plan.fragments, req.transport_lanes, plan.bits);
  const double fixed = c.latency_s + c.slow_start_s + c.local_s;
  // Bandwidth term scales as 1 / rate: the rate that gives `measured_s`.
  const double want = std::max(measured_s - fixed, 1e-6);
  const double scale = req.capacity_scale * (c.bandwidth_s / want);
  return std::clamp(std::isfinite(scale) ? scale : 1.0, 1e-3, 1e3);
}

bool drifted(double predicted, double measured, double threshold) {
  if (!(predicted > 0) || !(measured > 0)) return false;
  return std::abs(measured / predicted - 1.0) > threshold;
}

compression::PipelineConfig plan_compression(const compression::PipelineConfig& base, const PlanDecision& plan) {
  compression::PipelineConfig c = base;
  c.codec = *compression::codec_from_name(plan.codec);
  c.topk.reset();
  if (plan.bits < 16) c.error_feedback = true;
  c.validate();
  return c;
}

}  // namespace geoloco::outer

// Rendering of a BudgetReport: an aligned text table for people, JSON for scripts.
#include <fmt/format.h>

#include <cmath>
#include <string>
#include <vector>

#include "planner/budget.hpp"
#include "tools/planner/budget_report.hpp"
#include "planner/physics.hpp"
#include "planner/quantity.hpp"

namespace geoloco::planner {
namespace {

struct Table {
  std::vector<std::pair<std::string, std::string>> rows;
  std::string out;
  void section(const std::string& title) {
    flush();
    out += (out.empty() ? "" : "\n") + title + "\n";
  }
  void row(std::string k, std::string v) { rows.emplace_back(std::move(k), std::move(v)); }
  void flush() {
    size_t w = 0;
    for (auto& [k, v] : rows) w = std::max(w, k.size());
    for (auto& [k, v] : rows) out += fmt::format("  {:<{}}  {}\n", k, w, v);
    rows.clear();
  }
};

std::string pct(double u) { return fmt::format("{:.2f}%", 100 * u); }

nlohmann::json sync_json(const SyncCost& c) {
  return {{"payload_bytes", c.payload_bytes},
          {"egress_bytes", c.egress_bytes},
          {"connections", c.connections},
          {"per_connection_cap_bytes_per_s", c.per_connection_cap_Bps},
          {"rate_bytes_per_s", c.rate_Bps},
          {"bdp_bound", c.bdp_bound},
          {"rounds", c.rounds},
          {"message_bytes", c.message_bytes},
          {"rtts_per_round", c.rtts_per_round},
          {"bandwidth_s", c.bandwidth_s},
          {"latency_s", c.latency_s},
          {"check_s", c.check_s},
          {"slow_start_s", c.slow_start_s},
          {"local_s", c.local_s},
          {"total_s", c.total_s}};
}

nlohmann::json eval_json(const Evaluation& e) {
  return {{"H", e.H},
          {"bits", e.bits > 0 ? nlohmann::json(e.bits) : nlohmann::json(nullptr)},  // null: bytes_per_value given
          {"bytes_per_value", e.bytes_per_value},
          {"fragments", e.fragments},
          {"lanes", e.lanes},
          {"exchange", pattern_name(e.pattern)},
          {"fragment_sync", sync_json(e.fragment_sync)},
          {"compute_s", e.compute_s},
          {"hide_window_s", e.hide_window_s},
          {"exposed_s", e.exposed_s},
          {"utilization", e.utilization}};
}

}  // namespace

std::string format_budget_table(const BudgetReport& r) {
  const BudgetInput& in = r.input;
  const Evaluation& e = r.current;
  const SyncCost& f = e.fragment_sync;
  Table t;
  t.section("inputs");
  t.row("model", fmt::format("{} parameters ({})", format_count(in.params), in.params_source));
  t.row("compression",
        in.bytes_per_value_override
            ? fmt::format("{} bytes/value (given; bits, block and scale do not apply)", in.bytes_per_value())
            : fmt::format("{} bits, block {}, {} B scale -> {:.5g} bytes/value", in.bits, in.block, in.scale_bytes,
                          in.bytes_per_value()));
  t.row("sites", fmt::format("{}", in.sites));
  t.row("round trip", fmt::format("{} ({}){}", format_seconds(in.rtt_s), in.rtt_source,
                                  in.rtt_p99_s > 0 ? ", p99 " + format_seconds(in.rtt_p99_s) : ""));
  if (in.measured_retransmit_pct)
    t.row("TCP retransmissions",
          fmt::format("{:.3g}% of segments (measured; not part of the model)", *in.measured_retransmit_pct));
  {
    const double cap = in.site_capacity_Bps();
    const double spec = gbit_to_bytes_per_s(in.link_gbps) * static_cast<double>(in.parallel_links);
    std::string why = in.link_gbps > 0 && cap >= spec
                          ? fmt::format("{} x {} Gbit/s", in.parallel_links, in.link_gbps)
                          : fmt::format("measured with {} connections", in.measured_connections);
    t.row("site WAN capacity", std::isfinite(cap) ? fmt::format("{} ({})", format_rate_bits(cap), why) : "unbounded");
  }
  t.row("inner step", fmt::format("{} ({})", format_seconds(in.step_time_s), in.step_time_source));
  t.row(
      "latency per sync",
      in.rtts_per_round >= 0
          ? fmt::format("{} RTT per round (link.rtts_per_round) + {} RTT hash check", in.rtts_per_round, in.check_rtts)
          : fmt::format("0.5 RTT per round for messages up to eager_bytes ({}), 1.5 above (rendezvous); + {} "
                        "RTT hash check",
                        format_bytes(in.eager_bytes), in.check_rtts));
  if (in.local_sync_s > 0)
    t.row("local work per sync",
          fmt::format("{} per full sync, / fragments (schedule.local_sync_s)", format_seconds(in.local_sync_s)));
  t.row("schedule", fmt::format("H {}, {} fragment(s), overlap {} step(s), {} ranks x {} lane(s), {}", in.H,
                                in.fragments, in.overlap_steps, in.ranks, in.lanes, pattern_name(in.pattern)));

  t.section("bytes per sync (per site)");
  t.row("pseudo-gradient", format_bytes(r.full_sync.payload_bytes));
  t.row("sent per full sync", fmt::format("{} ({})", format_bytes(r.full_sync.egress_bytes), pattern_name(in.pattern)));
  t.row("sent per fragment sync", format_bytes(f.egress_bytes));

  t.section("TCP window / bandwidth-delay product");
  t.row("window per connection", fmt::format("{} (tcp_rmem max {} x {})", format_bytes(r.window_bytes),
                                             format_bytes(in.tcp_rmem_max_bytes), in.tcp_window_fraction));
  t.row("cap per connection", fmt::format("{}{}", format_rate_bits(f.per_connection_cap_Bps),
                                          in.measured_per_connection_Bps ? " (measured)" : " (window / RTT)"));
  t.row("connections per site", fmt::format("{} -> {}{}", f.connections, format_rate_bits(f.rate_Bps),
                                            f.bdp_bound ? " (BDP-bound: below link capacity)" : " (link-bound)"));
  if (r.connections_to_fill_link > 0) {
    t.row("to fill the link",
          fmt::format("{} connections at this window, or tcp_rmem max >= {} with {} connections",
                      r.connections_to_fill_link, format_bytes(r.rmem_to_fill_link), f.connections));
  }

  t.section("transfer time");
  auto sync_row = [&](const std::string& name, const SyncCost& c) {
    t.row(name, fmt::format("{} = bandwidth {} + latency {} ({} round(s){}){}{}", format_seconds(c.total_s),
                            format_seconds(c.bandwidth_s), format_seconds(c.latency_s), c.rounds,
                            c.check_s > 0 ? ", hash check " + format_seconds(c.check_s) : "",
                            c.slow_start_s > 0 ? " + slow start " + format_seconds(c.slow_start_s) : "",
                            c.local_s > 0 ? " + local " + format_seconds(c.local_s) : ""));
  };
  sync_row("full sync, " + std::string(pattern_name(in.pattern)), r.full_sync);
  if (in.pattern == Pattern::AllToAll) sync_row("full sync, ring (comparison)", r.ring_full_sync);
  if (in.pattern != Pattern::Owner && in.sites >= 3)
    sync_row("full sync, owner (outer.exchange: owner)", r.owner_full_sync);
  if (in.fragments > 1) sync_row("one fragment", f);

  t.section("utilization");
  t.row("compute per H steps", format_seconds(e.compute_s));
  t.row("hidden per fragment", fmt::format("{} (overlap {} steps)", format_seconds(e.hide_window_s), in.overlap_steps));
  t.row("exposed wait per H", format_seconds(e.exposed_s));
  t.row("compute utilization", pct(e.utilization));

  t.section("WAN bytes vs per-step data parallelism (per site, per H steps)");
  t.row("geoloco", format_bytes(r.geoloco_bytes_per_period));
  t.row("DDP across sites", fmt::format("{} ({} bytes/value ring all-reduce every step)",
                                        format_bytes(r.dp_bytes_per_period), in.dp_bytes_per_value));
  t.row("ratio", fmt::format("{:.4g}x fewer bytes", r.dp_bytes_per_period / r.geoloco_bytes_per_period));
  t.row("DDP step comm",
        fmt::format("{} per step -> utilization {}", format_seconds(r.dp_step_comm_s), pct(r.dp_utilization)));

  t.section(fmt::format("smallest H for {} utilization (H >= {})", pct(in.target_utilization), in.h_floor));
  if (r.search.found) {
    const Evaluation& b = r.search.best;
    t.row("H", fmt::format("{}", b.H));
    t.row("with", fmt::format("{} bits ({:.5g} bytes/value), {} fragment(s), {} lane(s), exchange {}", b.bits,
                              b.bytes_per_value, b.fragments, b.lanes, pattern_name(b.pattern)));
    t.row("utilization", fmt::format("{} (fragment sync {}, exposed {} per H)", pct(b.utilization),
                                     format_seconds(b.fragment_sync.total_s), format_seconds(b.exposed_s)));
  } else {
    t.row("not found", r.search.reason);
  }
  t.flush();
  return t.out;
}

nlohmann::json budget_json(const BudgetReport& r) {
  const BudgetInput& in = r.input;
  nlohmann::json j;
  j["format"] = "geoloco-budget-report";
  j["version"] = 1;
  j["inputs"] = {
      {"params", in.params},
      {"params_source", in.params_source},
      {"bytes_per_value", in.bytes_per_value()},
      // A given bytes_per_value (--bytes-per-value) overrides bits, block and scale:
      // bits is then null, not the default it did not use.
      {"bytes_per_value_given", in.bytes_per_value_override.has_value()},
      {"bits", in.bytes_per_value_override ? nlohmann::json(nullptr) : nlohmann::json(in.bits)},
      {"sites", in.sites},
      {"rtt_s", in.rtt_s},
      {"rtt_p99_s", in.rtt_p99_s},
      {"rtt_source", in.rtt_source},
      {"retransmit_pct",
       in.measured_retransmit_pct ? nlohmann::json(*in.measured_retransmit_pct) : nlohmann::json(nullptr)},
      {"site_capacity_bytes_per_s",
       std::isfinite(in.site_capacity_Bps()) ? nlohmann::json(in.site_capacity_Bps()) : nlohmann::json(nullptr)},
      {"step_time_s", in.step_time_s},
      {"H", in.H},
      {"fragments", in.fragments},
      {"overlap_steps", in.overlap_steps},
      {"ranks", in.ranks},
      {"lanes", in.lanes},
      {"pattern", pattern_name(in.pattern)},
      {"rtts_per_round", in.rtts_per_round >= 0 ? nlohmann::json(in.rtts_per_round) : nlohmann::json("auto")},
      {"eager_bytes", in.eager_bytes},
      {"check_rtts", in.check_rtts},
      {"local_sync_s", in.local_sync_s},
      {"target_utilization", in.target_utilization},
      {"h_floor", in.h_floor}};
  j["full_sync"] = sync_json(r.full_sync);
  j["ring_full_sync"] = sync_json(r.ring_full_sync);
  j["owner_full_sync"] = sync_json(r.owner_full_sync);
  j["tcp"] = {{"window_bytes", r.window_bytes},
              {"per_connection_cap_bytes_per_s", r.current.fragment_sync.per_connection_cap_Bps},
              {"connections_to_fill_link", r.connections_to_fill_link},
              {"rmem_to_fill_link_bytes", r.rmem_to_fill_link}};
  j["current"] = eval_json(r.current);
  j["wan_vs_ddp"] = {{"geoloco_bytes_per_period", r.geoloco_bytes_per_period},
                     {"ddp_bytes_per_period", r.dp_bytes_per_period},
                     {"ratio", r.dp_bytes_per_period / r.geoloco_bytes_per_period},
                     {"ddp_step_comm_s", r.dp_step_comm_s},
                     {"ddp_utilization", r.dp_utilization}};
  j["smallest_h"] = {{"found", r.search.found}, {"reason", r.search.reason}};
  if (r.search.found || r.search.best.H > 0) j["smallest_h"]["evaluation"] = eval_json(r.search.best);
  return j;
}

}  // namespace geoloco::planner

#include "tools/probe/probe_report.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <ctime>

namespace geoloco::probe {

namespace {

std::string gbps_text(double g) {
  if (g >= 1) return fmt::format("{:.3f} Gbit/s", g);
  return fmt::format("{:.1f} Mbit/s", g * 1e3);
}

std::string retrans_text(const StreamResult& s) {
  if (!s.retransmits) return "n/a";
  return fmt::format("{:.3f}% ({} of {})", s.retransmits->pct(), s.retransmits->retrans_segs,
                     s.retransmits->out_segs + s.retransmits->retrans_segs);
}

std::string utc_now() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string pair_line(const ProbeResult& r) {
  std::string s = fmt::format("{} -> {}: rtt median {:.3f} ms, p99 {:.3f} ms", r.initiator, r.responder, r.rtt.median_ms,
                              r.rtt.p99_ms);
  if (r.single) s += fmt::format("; 1 connection {:.6g} Gbit/s", r.single->gbps);
  if (r.multi) s += fmt::format("; {} connections {:.6g} Gbit/s", r.multi->connections, r.multi->gbps);
  for (const auto* st : {&r.single, &r.multi})
    if (*st && (*st)->retransmits)
      s += fmt::format("; retransmitted {:.4g}% ({} conn.)", (*st)->retransmits->pct(), (*st)->connections);
  return s;
}

}  // namespace

planner::MeasuredPath worst_path(const ProbeRun& run) {
  planner::MeasuredPath m;
  bool first = true;
  for (const auto& r : run.pairs) {
    m.rtt_median_ms = std::max(m.rtt_median_ms, r.rtt.median_ms);
    m.rtt_p99_ms = std::max(m.rtt_p99_ms, r.rtt.p99_ms);
    if (r.single) m.per_connection_gbps = first ? r.single->gbps : std::min(m.per_connection_gbps, r.single->gbps);
    // The all-lanes figure; with one lane the single stream is that figure.
    const auto& all = r.multi ? r.multi : r.single;
    if (all) {
      m.connections = all->connections;
      m.connections_gbps = first ? all->gbps : std::min(m.connections_gbps, all->gbps);
    }
    for (const auto* st : {&r.single, &r.multi})
      if (*st && (*st)->retransmits)
        m.retransmit_pct = std::max(m.retransmit_pct.value_or(0.0), (*st)->retransmits->pct());
    first = false;
  }
  return m;
}

std::string format_probe_table(const ProbeRun& run) {
  std::string out;
  if (run.mode == "config") {
    out += fmt::format("geoloco probe: {} site(s) of {} (this is {}), {} connection(s) per pair\n", run.sites.size(),
                       run.endpoint, run.self, run.lanes);
  } else {
    out += fmt::format("geoloco probe: {} {} ({} side), {} connection(s)\n",
                       run.mode == "listen" ? "listening on" : "connected to", run.endpoint,
                       run.mode == "listen" ? "responder" : "initiator", run.lanes);
  }
  if (run.emulate.enabled())
    out += fmt::format("  (transport.emulate is on: {} ms one-way delay, {} Mbit/s cap at the sender)\n",
                       run.emulate.delay_ms, run.emulate.rate_mbit);
  std::vector<std::vector<std::string>> rows;
  rows.push_back({"pair", "rtt median", "rtt p99", "1 connection", fmt::format("{} connections", run.lanes),
                  "retransmitted (1 / N)"});
  for (const auto& r : run.pairs) {
    std::string re = r.single ? retrans_text(*r.single) : "-";
    if (r.multi) re += " / " + retrans_text(*r.multi);
    rows.push_back({fmt::format("{} -> {}", r.initiator, r.responder), fmt::format("{:.3f} ms", r.rtt.median_ms),
                    fmt::format("{:.3f} ms", r.rtt.p99_ms), r.single ? gbps_text(r.single->gbps) : "-",
                    r.multi ? gbps_text(r.multi->gbps) : (r.lanes == 1 ? "(= 1 connection)" : "-"), re});
  }
  std::vector<size_t> w(rows[0].size(), 0);
  for (const auto& row : rows)
    for (size_t i = 0; i < row.size(); ++i) w[i] = std::max(w[i], row[i].size());
  for (const auto& row : rows) {
    std::string line = " ";
    for (size_t i = 0; i < row.size(); ++i) line += fmt::format("  {:<{}}", row[i], w[i]);
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  if (!run.pairs.empty()) {
    const auto& r = run.pairs.front();
    const auto& s = r.single ? r.single : r.multi;
    if (s)
      out += fmt::format(
          "  throughput: measured at the receiver over {:.2f} s after omitting {:.2f} s of slow start ({} messages of "
          "{} bytes, {} in flight)\n",
          s->receiver.counted_s, s->receiver.omitted_s, s->receiver.messages, s->message_bytes, s->window);
    out += fmt::format("  rtt: {} ping-pongs of small frames over the transport (UCX active messages over TCP)\n",
                       r.rtt.count);
    for (const auto& p : run.pairs)
      for (const auto* st : {&p.single, &p.multi})
        if (*st && (*st)->receiver.coarse)
          out += fmt::format("  WARNING: {} -> {} with {} connection(s) is a coarse figure (only {} messages for a "
                             "window of {}): raise --seconds or lower --message-bytes\n",
                             p.initiator, p.responder, (*st)->connections, (*st)->receiver.messages, (*st)->window);
    for (const auto& p : run.pairs)
      for (const auto* st : {&p.single, &p.multi})
        if (*st && pipeline_limited(**st, p.rtt.median_ms))
          out += fmt::format("  WARNING: {} -> {} with {} connection(s) may be limited by the probe's pipeline ({} x {} "
                             "bytes in flight < 2 x bandwidth-delay product): raise --window or --message-bytes\n",
                             p.initiator, p.responder, (*st)->connections, (*st)->window, (*st)->message_bytes);
    out += "  retransmitted: TCP RetransSegs / (OutSegs + RetransSegs) in the sender's network namespace "
           "(/proc/net/snmp, every socket in it) during each stream\n";
  }
  return out;
}

nlohmann::json probe_json(const ProbeRun& run) {
  nlohmann::json j;
  j["format"] = "geoloco-probe";
  j["version"] = 1;
  j["mode"] = run.mode;
  j["self"] = run.self;
  j["endpoint"] = run.endpoint;
  j["sites"] = run.sites;
  j["transport"] = {{"lanes", run.lanes},
                    {"chunk_bytes", run.chunk_bytes},
                    {"emulate", run.emulate.enabled() ? nlohmann::json{{"delay_ms", run.emulate.delay_ms},
                                                                       {"rate_mbit", run.emulate.rate_mbit}}
                                                      : nlohmann::json(nullptr)}};
  j["pairs"] = nlohmann::json::array();
  for (const auto& r : run.pairs) j["pairs"].push_back(to_json(r));
  const auto m = worst_path(run);
  j["measured"] = {{"rtt_ms", {{"median", m.rtt_median_ms}, {"p99", m.rtt_p99_ms}}},
                   {"per_connection_gbps", m.per_connection_gbps},
                   {"connections", m.connections},
                   {"connections_gbps", m.connections_gbps},
                   {"retransmit_pct", m.retransmit_pct ? nlohmann::json(*m.retransmit_pct) : nlohmann::json(nullptr)}};
  return j;
}

std::string budget_yaml(const ProbeRun& run, const std::optional<BudgetContext>& ctx) {
  std::string out = fmt::format("# Written by `geoloco probe` ({}) at {}, {} connection(s) per pair.\n",
                                run.mode == "config" ? "config " + run.endpoint + ", site " + run.self
                                                     : run.mode + " " + run.endpoint,
                                utc_now(), run.lanes);
  for (const auto& r : run.pairs) out += "#   " + pair_line(r) + "\n";
  if (run.pairs.size() > 1) out += "# measured: is the worst pair of each figure (a sync waits for its slowest pair).\n";
  if (run.emulate.enabled())
    out += fmt::format("# NOTE: transport.emulate was on ({} ms, {} Mbit/s): these are emulated figures.\n",
                       run.emulate.delay_ms, run.emulate.rate_mbit);
  if (!ctx) out += "# Plan with: geoloco budget --from THIS_FILE --params 124M --step-time 0.5 (or --config run.yaml)\n";
  out += fmt::format("format: {}\nversion: {}\n", planner::kBudgetFormat, planner::kBudgetVersion);
  if (ctx) {
    out += fmt::format("model: {{params: {}}}   # from {}\n", ctx->params, ctx->config);
    if (ctx->bits) out += fmt::format("compression: {{bits: {}, block: {}}}\n", *ctx->bits, ctx->block);
  }
  out += fmt::format("sites: {}\n", std::max<size_t>(2, run.sites.size()));
  out += planner::measured_yaml(worst_path(run));
  if (ctx) {
    out += fmt::format("schedule: {{H: {}, fragments: {}, overlap_steps: {}, ranks: {}, lanes: {}}}\n", ctx->H,
                       ctx->fragments, ctx->overlap_steps, ctx->ranks, ctx->lanes);
    out += "# schedule.step_time_s is not known before training: add --step-time to geoloco budget.\n";
  }
  return out;
}

}  // namespace geoloco::probe

#include "planner/budget.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "planner/physics.hpp"
#include "planner/quantity.hpp"
#include "planner/yaml_section.hpp"
#include "trainer/model/model_config.hpp"

namespace geoloco::planner {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

std::vector<int> int_list(const config::Node& n, std::string_view key, std::vector<int> dflt, int lo, int hi) {
  auto v = n.get<std::vector<int>>(key, dflt);
  if (v.empty()) n.fail(key, "expected a non-empty list");
  for (int x : v)
    if (x < lo || x > hi) n.fail(key, fmt::format("element {} is out of range [{}, {}]", x, lo, hi));
  return v;
}

// A byte count (a number or "8MiB"-style text) at `key`, or `dflt` when absent; bad text
// fails naming the key with an example.
double byte_count(const config::Node& n, std::string_view key, double dflt, const char* example) {
  if (!n.has(key)) return dflt;
  const std::string t = n.get<std::string>(key, "");
  try {
    return parse_count(t, n.key_path(key));
  } catch (const InputError&) {
    n.fail(key, fmt::format("got '{}', expected bytes such as {}", t, example));
  }
}

}  // namespace

const char* pattern_name(Pattern p) {
  switch (p) {
    case Pattern::AllToAll: return "all_to_all";
    case Pattern::Ring: return "ring";
    case Pattern::Owner: return "owner";
  }
  return "?";
}

double BudgetInput::bytes_per_value() const {
  if (bytes_per_value_override) return *bytes_per_value_override;
  return planner::bytes_per_value(bits, block, scale_bytes);
}

double BudgetInput::bytes_per_value_for_bits(int b) const { return planner::bytes_per_value(b, block, scale_bytes); }

double BudgetInput::site_capacity_Bps() const {
  double cap = link_gbps > 0 ? gbit_to_bytes_per_s(link_gbps) * static_cast<double>(parallel_links) : kInf;
  // A probe's N-connection figure bounds the path only if it was not simply N x the
  // per-connection cap (then the connections, not the path, were the limit).
  if (measured_path_Bps) {
    double conn_limit = measured_per_connection_Bps ? *measured_per_connection_Bps * measured_connections : kInf;
    if (*measured_path_Bps < 0.9 * conn_limit || link_gbps <= 0) cap = std::min(cap, *measured_path_Bps);
  }
  return cap;
}

double BudgetInput::per_connection_cap_Bps() const {
  if (measured_per_connection_Bps) return *measured_per_connection_Bps;
  return bdp_cap_bytes_per_s(tcp_window_bytes(tcp_rmem_max_bytes, tcp_window_fraction), rtt_s);
}

BudgetInput BudgetInput::from_yaml(const config::Node& root) {
  BudgetInput in;
  const std::string format = root.get<std::string>("format", "");
  if (format != kBudgetFormat) root.fail_value("format", fmt::format("'{}'", kBudgetFormat));
  const int64_t version = root.get_int("version", 0, 0, std::numeric_limits<int64_t>::max());
  if (version != kBudgetVersion)
    root.fail("version",
              fmt::format("budget file version {} is not supported (this build reads {})", version, kBudgetVersion));

  // model: either params (a count, "1T" works) or a GPT-2 model section (n_layer, ...).
  auto model = section(root, "model");
  if (model.has("params")) {
    std::string text = model.get<std::string>("params", "");
    try {
      in.params = parse_count(text, model.key_path("params"));
    } catch (const InputError& e) {
      model.fail("params", fmt::format("got '{}', expected a count such as 124M or 1.5e12", text));
    }
    if (in.params < 1) model.fail("params", "expected at least 1 parameter");
    in.params_source = "model.params";
    model.finish();
  } else {
    auto mc = trainer::ModelConfig::from_yaml(model);
    in.params = static_cast<double>(mc.num_params());
    in.params_source = fmt::format("GPT-2 L={} C={} V={} T={}", mc.n_layer, mc.n_embd, mc.vocab_size, mc.block_size);
  }

  auto comp = section(root, "compression");
  in.bits = static_cast<int>(comp.get_int("bits", in.bits, 1, 32));
  in.block = comp.get_int("block", in.block, 1, int64_t(1) << 30);
  in.scale_bytes = comp.get_double("scale_bytes", in.scale_bytes, 0, 16);
  if (comp.has("bytes_per_value")) in.bytes_per_value_override = comp.get_double("bytes_per_value", 0, 1e-6, 8);
  comp.finish();
  try {
    (void)in.bytes_per_value_for_bits(in.bits);
  } catch (const InputError&) {
    comp.fail_value("bits", "one of 32 | 16 | 8 | 4 | 2 | 1");
  }

  in.sites = static_cast<int>(root.get_int("sites", in.sites, 2, 1 << 20));

  auto link = section(root, "link");
  const bool has_km = link.has("distance_km"), has_rtt = link.has("rtt_ms");
  if (has_km && has_rtt) link.fail("rtt_ms", "give distance_km or rtt_ms, not both");
  if (has_km) {
    double km = link.get_double("distance_km", 0, 0, 1e6);
    in.rtt_s = fiber_rtt_s(km);
    in.rtt_source = fmt::format("{} km of fiber at 5 us/km", km);
  } else if (has_rtt) {
    in.rtt_s = link.get_double("rtt_ms", 0, 0, 1e6) * 1e-3;
    in.rtt_source = "link.rtt_ms";
  }
  in.rtt_p99_s = link.get_double("rtt_p99_ms", 0, 0, 1e6) * 1e-3;
  in.link_gbps = link.get_double("rate_gbps", 0, 0, 1e9);
  in.parallel_links = link.get_int("parallel_links", in.parallel_links, 1, int64_t(1) << 30);
  if (link.has("tcp_rmem_max")) {
    in.tcp_rmem_max_bytes = byte_count(link, "tcp_rmem_max", in.tcp_rmem_max_bytes, "6291456 or 32MiB");
    if (in.tcp_rmem_max_bytes < 4096) link.fail_value("tcp_rmem_max", "at least 4096 bytes");
  }
  in.tcp_window_fraction = link.get_double("tcp_window_fraction", in.tcp_window_fraction, 0.01, 1.0);
  if (link.has("rtts_per_round")) in.rtts_per_round = link.get_double("rtts_per_round", 0, 0, 100);
  in.eager_bytes = byte_count(link, "eager_bytes", in.eager_bytes, "8388608 or 8MiB");
  in.check_rtts = link.get_double("check_rtts", in.check_rtts, 0, 100);
  in.slow_start = link.get<bool>("slow_start", in.slow_start);
  in.initial_window_bytes = link.get_double("initial_window_bytes", in.initial_window_bytes, 1, 1e12);
  link.finish();

  // measured: what `geoloco probe` writes; each figure replaces the estimate it measures.
  auto meas = section(root, "measured");
  if (meas.has("rtt_ms")) {
    auto rtt = meas.child("rtt_ms");  // present: has() checked
    in.rtt_s = rtt.get_double("median", 0, 1e-6, 1e6) * 1e-3;
    if (!rtt.has("median")) rtt.fail("median", "missing required key");
    in.rtt_p99_s = rtt.get_double("p99", 0, 0, 1e6) * 1e-3;
    if (in.rtt_p99_s > 0 && in.rtt_p99_s < in.rtt_s) rtt.fail("p99", "p99 is below the median");
    in.rtt_source = "measured.rtt_ms.median";
    rtt.finish();
  }
  if (meas.has("per_connection_gbps"))
    in.measured_per_connection_Bps = gbit_to_bytes_per_s(meas.get_double("per_connection_gbps", 0, 1e-9, 1e9));
  if (meas.has("connections_gbps")) {
    in.measured_path_Bps = gbit_to_bytes_per_s(meas.get_double("connections_gbps", 0, 1e-9, 1e9));
    if (!meas.has("connections")) meas.fail("connections", "missing: how many connections carried connections_gbps");
  }
  in.measured_connections = meas.get_int("connections", 0, 0, int64_t(1) << 30);
  if (meas.has("retransmit_pct")) in.measured_retransmit_pct = meas.get_double("retransmit_pct", 0, 0, 100);
  std::optional<double> measured_step;
  if (meas.has("step_time_s")) measured_step = meas.get_double("step_time_s", 0, 1e-9, 1e9);
  meas.finish();

  auto sched = section(root, "schedule");
  in.step_time_s = sched.get_double("step_time_s", 0, 0, 1e9);
  in.step_time_source = "schedule.step_time_s";
  if (measured_step) {
    in.step_time_s = *measured_step;
    in.step_time_source = "measured.step_time_s";
  }
  in.H = sched.get_int("H", in.H, 1, int64_t(1) << 40);
  in.fragments = static_cast<int>(sched.get_int("fragments", in.fragments, 1, 1 << 20));
  in.overlap_steps = sched.get_int("overlap_steps", in.overlap_steps, 0, int64_t(1) << 40);
  in.ranks = static_cast<int>(sched.get_int("ranks", in.ranks, 1, 1 << 20));
  in.lanes = static_cast<int>(sched.get_int("lanes", in.lanes, 1, 1 << 20));
  const std::string pattern = sched.get_choice("pattern", "all_to_all", {"all_to_all", "ring", "owner"});
  in.pattern = pattern == "ring" ? Pattern::Ring : pattern == "owner" ? Pattern::Owner : Pattern::AllToAll;
  in.dp_bytes_per_value = sched.get_double("dp_bytes_per_value", in.dp_bytes_per_value, 0.125, 8);
  in.local_sync_s = sched.get_double("local_sync_s", in.local_sync_s, 0, 1e9);
  sched.finish();

  auto target = section(root, "target");
  in.target_utilization = target.get_double("utilization", in.target_utilization, 1e-6, 1.0);
  in.h_floor = target.get_int("h_floor", in.h_floor, 1, int64_t(1) << 40);
  in.h_max = target.get_int("h_max", in.h_max, 1, int64_t(1) << 40);
  in.search_bits = int_list(target, "bits", in.search_bits, 1, 32);
  for (int b : in.search_bits) {
    if (b != 32 && b != 16 && b != 8 && b != 4 && b != 2 && b != 1)
      target.fail("bits", fmt::format("element {} is not one of 32 | 16 | 8 | 4 | 2 | 1", b));
  }
  in.search_fragments = int_list(target, "fragments", in.search_fragments, 1, 1 << 20);
  in.search_lanes = int_list(target, "lanes", in.search_lanes, 1, 1 << 20);
  target.finish();

  root.finish();

  if (in.rtt_s <= 0)
    root.fail("link", "no round trip: give link.distance_km (> 0), link.rtt_ms (> 0) or measured.rtt_ms");
  if (in.link_gbps <= 0 && !in.measured_path_Bps)
    link.fail("rate_gbps", "missing: give link.rate_gbps or measured.connections_gbps");
  if (in.step_time_s <= 0)
    sched.fail("step_time_s", "missing or zero: give schedule.step_time_s or measured.step_time_s");
  if (in.h_max < in.h_floor)
    target.fail("h_max", fmt::format("got {}, expected >= h_floor ({})", in.h_max, in.h_floor));
  in.validate();
  return in;
}

void BudgetInput::validate() const {
  if (!(params >= 1)) throw InputError(fmt::format("params: got {}, expected >= 1", params));
  if (sites < 2) throw InputError(fmt::format("sites: got {}, expected >= 2", sites));
  if (!(rtt_s > 0)) throw InputError(fmt::format("rtt: got {} s, expected > 0", rtt_s));
  if (!(step_time_s > 0)) throw InputError(fmt::format("step time: got {} s, expected > 0", step_time_s));
  if (overlap_steps > H)
    throw InputError(
        fmt::format("schedule.overlap_steps ({}) exceeds H ({}): a fragment must land "
                    "before its next sync starts",
                    overlap_steps, H));
  if (fragments > H)
    throw InputError(
        fmt::format("schedule.fragments ({}) exceeds H ({}): fragments are staggered at "
                    "least one step apart",
                    fragments, H));
  (void)bytes_per_value();
}

SyncCost sync_cost(const BudgetInput& in, double bpv, int fragments, int lanes, int bits) {
  SyncCost c;
  const double S = in.sites;
  c.payload_bytes = in.params * bpv / fragments;
  const int64_t per_pair = int64_t(in.ranks) * lanes;
  if (in.pattern == Pattern::AllToAll) {
    c.egress_bytes = (S - 1) * c.payload_bytes;
    c.connections = (in.sites - 1) * per_pair;
    c.rounds = 1;
  } else if (in.pattern == Pattern::Owner) {
    c.egress_bytes = 2 * (S - 1) / S * c.payload_bytes;
    c.connections = (in.sites - 1) * per_pair;
    c.rounds = 2;
  } else {
    c.egress_bytes = 2 * (S - 1) / S * c.payload_bytes;
    c.connections = per_pair;
    c.rounds = 2 * (in.sites - 1);
  }
  c.per_connection_cap_Bps = in.per_connection_cap_Bps();
  const double capacity = in.site_capacity_Bps();
  c.rate_Bps = std::min(capacity, c.connections * c.per_connection_cap_Bps);
  c.bdp_bound = c.connections * c.per_connection_cap_Bps < capacity;
  c.bandwidth_s = c.egress_bytes / c.rate_Bps;
  // The hash check runs once per sync, after the outer step, whatever the pattern.
  c.check_s = in.check_rtts * in.rtt_s;
  // Each rank sends its slice of the round's bytes to each peer as one message.
  c.message_bytes = c.egress_bytes / static_cast<double>(c.rounds) /
                    static_cast<double>(in.pattern == Pattern::Ring ? in.ranks : (in.sites - 1) * in.ranks);
  c.rtts_per_round = in.rtts_per_round >= 0 ? in.rtts_per_round : (c.message_bytes <= in.eager_bytes ? 0.5 : 1.5);
  c.latency_s = static_cast<double>(c.rounds) * c.rtts_per_round * in.rtt_s + c.check_s;
  c.local_s = in.local_sync_for(bits) / fragments;
  if (in.slow_start) {
    // Connections idle between syncs restart from the initial window (Linux default
    // tcp_slow_start_after_idle=1). A ring's rounds run back to back, so each connection
    // ramps once per sync in either pattern.
    const double per_conn_rate = c.rate_Bps / static_cast<double>(c.connections);
    const double per_conn_bytes = c.egress_bytes / static_cast<double>(c.connections);
    const double ramp = slow_start_transfer_s(per_conn_bytes, per_conn_rate, in.rtt_s, in.initial_window_bytes);
    c.slow_start_s = ramp - per_conn_bytes / per_conn_rate;
  }
  c.total_s = c.bandwidth_s + c.latency_s + c.slow_start_s + c.local_s;
  return c;
}

double exposed_wait_s(int64_t H, double step_s, int fragments, int64_t overlap_steps, double fragment_sync_s) {
  const double F = fragments;
  const double per_fragment = std::max(0.0, fragment_sync_s - static_cast<double>(overlap_steps) * step_s);
  // The link carries F fragment syncs per H steps; beyond that they queue.
  const double saturation = F * fragment_sync_s - static_cast<double>(H) * step_s;
  return std::max({F * per_fragment, saturation, 0.0});
}

double utilization(int64_t H, double step_s, double exposed_s) {
  const double compute = static_cast<double>(H) * step_s;
  return compute / (compute + exposed_s);
}

Evaluation evaluate(const BudgetInput& in, int64_t H, int bits, double bpv, int fragments, int lanes) {
  Evaluation e;
  e.H = H;
  e.pattern = in.pattern;
  e.bits = bits;
  e.bytes_per_value = bpv;
  e.fragments = fragments;
  e.lanes = lanes;
  e.fragment_sync = sync_cost(in, bpv, fragments, lanes, bits);
  e.compute_s = static_cast<double>(H) * in.step_time_s;
  e.hide_window_s = static_cast<double>(in.overlap_steps) * in.step_time_s;
  e.exposed_s = exposed_wait_s(H, in.step_time_s, fragments, in.overlap_steps, e.fragment_sync.total_s);
  e.utilization = utilization(H, in.step_time_s, e.exposed_s);
  return e;
}

HSearch smallest_h(const BudgetInput& given) {
  HSearch out;
  bool have_best_at_max = false;
  const std::vector<Pattern> patterns =
      given.search_patterns.empty() ? std::vector<Pattern>{given.pattern} : given.search_patterns;
  for (int bits : given.search_bits) {
    const double bpv = given.bytes_per_value_for_bits(bits);
    for (int F : given.search_fragments) {
      const int64_t lo = std::max({given.h_floor, given.overlap_steps, int64_t(F)});
      if (lo > given.h_max) continue;
      for (int lanes : given.search_lanes)
        for (Pattern pattern : patterns) {
          BudgetInput in = given;
          in.pattern = pattern;
          Evaluation top = evaluate(in, in.h_max, bits, bpv, F, lanes);
          if (top.utilization < in.target_utilization) {
            // Only while nothing reaches the target: the best reached at h_max, for the reason.
            if (!out.found && (!have_best_at_max || top.utilization > out.best.utilization)) {
              out.best = top;
              have_best_at_max = true;
            }
            continue;
          }
          // Bisect the smallest H in [lo, h_max] reaching the target (monotone in H).
          int64_t a = lo, b = in.h_max;
          while (a < b) {
            int64_t mid = a + (b - a) / 2;
            if (evaluate(in, mid, bits, bpv, F, lanes).utilization >= in.target_utilization)
              b = mid;
            else
              a = mid + 1;
          }
          // Strictly smaller H wins; equal H keeps the earlier (preferred) configuration.
          if (!out.found || a < out.best.H) {
            out.found = true;
            out.best = evaluate(in, a, bits, bpv, F, lanes);
          }
        }
    }
  }
  const BudgetInput& in = given;
  if (!out.found) {
    if (!have_best_at_max) {
      out.reason = fmt::format(
          "no configuration fits: h_max {} is below the floor max(h_floor {}, "
          "overlap_steps {}, fragments)",
          in.h_max, in.h_floor, in.overlap_steps);
    } else {
      out.reason = fmt::format(
          "target utilization {:.3f} is not reachable with H <= {}: best {:.4f} with "
          "{} bits, {} fragments, {} lanes",
          in.target_utilization, in.h_max, out.best.utilization, out.best.bits, out.best.fragments, out.best.lanes);
    }
  }
  return out;
}

BudgetReport plan_budget(const BudgetInput& in) {
  in.validate();
  BudgetReport r;
  r.input = in;
  const double bpv = in.bytes_per_value();
  // A given bytes_per_value replaces bits/block/scale: no bit width describes it (bits 0).
  r.current = evaluate(in, in.H, in.bytes_per_value_override ? 0 : in.bits, bpv, in.fragments, in.lanes);
  r.full_sync = sync_cost(in, bpv, 1, in.lanes);
  BudgetInput ring = in;
  ring.pattern = Pattern::Ring;
  r.ring_full_sync = sync_cost(ring, bpv, 1, in.lanes);
  BudgetInput owner = in;
  owner.pattern = Pattern::Owner;
  r.owner_full_sync = sync_cost(owner, bpv, 1, in.lanes);

  r.window_bytes = tcp_window_bytes(in.tcp_rmem_max_bytes, in.tcp_window_fraction);
  const double capacity = in.site_capacity_Bps();
  const double cap = in.per_connection_cap_Bps();
  if (std::isfinite(capacity)) {
    r.connections_to_fill_link = connections_needed(capacity, cap);
    r.rmem_to_fill_link = rmem_needed_bytes(capacity / static_cast<double>(r.current.fragment_sync.connections),
                                            in.rtt_s, in.tcp_window_fraction);
  }

  const double S = in.sites;
  r.dp_bytes_per_period = static_cast<double>(in.H) * 2 * (S - 1) / S * in.params * in.dp_bytes_per_value;
  r.geoloco_bytes_per_period = r.current.fragment_sync.egress_bytes * in.fragments;
  // Per-step data parallelism across sites: a ring all-reduce every inner step over the
  // ranks*lanes connections to the next site, 2(S-1) latency rounds, nothing hidden.
  BudgetInput dp = ring;
  dp.bytes_per_value_override = in.dp_bytes_per_value;
  dp.check_rtts = 0;  // DDP has no cross-site hash check and no codec
  dp.local_sync_s = 0;
  r.dp_step_comm_s = sync_cost(dp, in.dp_bytes_per_value, 1, in.lanes).total_s;
  r.dp_utilization = utilization(1, in.step_time_s, r.dp_step_comm_s);

  // The search weighs the owner exchange against all-to-all where it differs (3 sites or
  // more; a ring stays a ring: it is the comparison, not an exchange geoloco runs).
  BudgetInput search = in;
  if (in.search_patterns.empty() && in.pattern != Pattern::Ring && in.sites >= 3)
    search.search_patterns = {Pattern::AllToAll, Pattern::Owner};
  r.search = smallest_h(search);
  return r;
}

std::string measured_yaml(const MeasuredPath& m) {
  // fmt's "{}" prints the shortest text that parses back to the same double.
  std::string out = "measured:\n";
  if (m.rtt_median_ms > 0) {
    out += fmt::format("  rtt_ms: {{median: {}", m.rtt_median_ms);
    if (m.rtt_p99_ms > 0) out += fmt::format(", p99: {}", m.rtt_p99_ms);
    out += "}\n";
  }
  if (m.per_connection_gbps > 0) out += fmt::format("  per_connection_gbps: {}\n", m.per_connection_gbps);
  if (m.connections_gbps > 0 && m.connections > 0)
    out += fmt::format("  connections: {}\n  connections_gbps: {}\n", m.connections, m.connections_gbps);
  if (m.step_time_s > 0) out += fmt::format("  step_time_s: {}\n", m.step_time_s);
  if (m.retransmit_pct) out += fmt::format("  retransmit_pct: {}\n", *m.retransmit_pct);
  if (out == "measured:\n") out = "measured: {}\n";
  return out;
}

}  // namespace geoloco::planner

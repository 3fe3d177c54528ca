// The WAN budget model: what one DiLoCo sync costs on a path and what it does to compute
// utilization, plus the smallest H (with fragments, bits, lanes) that reaches a target.
// outer.plan: auto plans with it (auto_plan.cpp); `geoloco budget` (tools/planner) reports it.
//
// The model (docs/planning.md states every assumption):
//  * Each site ships its compressed pseudo-gradient, N values at `bytes_per_value`, split in
//    F fragments. Exchange pattern all_to_all (geoloco's): rank r of every site sends its
//    slice to rank r of each other site, over ranks*lanes connections per site pair, so a
//    site sends (S-1)*N*bpv/F bytes per fragment sync in one round. ring (for comparison):
//    2(S-1) rounds of N*bpv/(F*S) bytes over the ranks*lanes connections to one neighbour.
//    owner (outer.exchange: owner): two rounds over the same connections as all_to_all, each
//    site sending 1/S of its fragment to every other site in each: 2(S-1)/S*N*bpv/F bytes.
//    The owners' second encode (1/S of the fragment) is not priced apart (local_sync_s).
//  * Rate: min(site WAN capacity = rate x parallel links, connections x per-connection cap),
//    the cap being window/RTT (window = tcp_rmem max x window fraction) or a probe's figure.
//  * Latency: rtts_per_round round trips per round: 0.5 when each message of the round fits
//    the transport's eager size (transport.eager_bytes: sent without a handshake), 1.5 when
//    it goes by UCX's rendezvous (request, ready-to-receive, data); or a given value,
//    plus check_rtts once per sync (default 0: geoloco verifies a round's weight-hash check
//    at the next round, off the sync path; 0.5 models a check that waits), optional slow
//    start from an initial window after the idle gap between syncs.
//  * Local work: local_sync_s per full-model sync (compress, decode, outer step, copies: what
//    a sync costs over a zero-latency, unlimited link), local_sync_s / F per fragment sync.
//  * Overlap: a fragment sync may run for overlap_steps (tau) inner steps before it must have
//    landed; per H steps the exposed wait is max(F*max(0, t_f - tau*t), F*t_f - H*t, 0) and
//    utilization = H*t / (H*t + exposed). With F=1, tau=0: H*t / (H*t + t_sync).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/config_node.hpp"

namespace geoloco::planner {

enum class Pattern { AllToAll, Ring, Owner };
const char* pattern_name(Pattern p);

// Identifies a budget YAML (written by `geoloco probe`, read by `geoloco budget --from`).
inline constexpr const char* kBudgetFormat = "geoloco-budget";
inline constexpr int kBudgetVersion = 1;

struct BudgetInput {
  // Model: values per full sync.
  double params = 0;
  std::string params_source;  // how params was obtained, for the report

  // Compression: bits per value (32, 16, 8, 4, 2, 1) and blockwise scale overhead; or an
  // explicit bytes_per_value (e.g. after zstd) that overrides bits/block/scale.
  int bits = 4;
  int64_t block = 128;
  double scale_bytes = 4;  // fp32 absmax scale per block
  std::optional<double> bytes_per_value_override;
  double bytes_per_value() const;
  double bytes_per_value_for_bits(int bits) const;  // same block/scale, other bit width

  int sites = 2;

  // Path.
  double rtt_s = 0;
  double rtt_p99_s = 0;  // 0 when unknown
  std::string rtt_source;
  double link_gbps = 0;  // one link's rate, Gbit/s
  int64_t parallel_links = 1;
  double tcp_rmem_max_bytes = 6291456;                // Linux default tcp_rmem max (6 MiB)
  double tcp_window_fraction = 0.5;                   // tcp_adv_win_scale=1: half the buffer is window
  std::optional<double> measured_per_connection_Bps;  // probe: one connection's throughput
  std::optional<double> measured_path_Bps;            // probe: N connections together
  int64_t measured_connections = 0;
  std::optional<double> measured_retransmit_pct;  // probe: TCP retransmissions (reported only)

  // Schedule.
  double step_time_s = 0;
  std::string step_time_source;
  int64_t H = 100;
  int fragments = 1;
  int64_t overlap_steps = 0;
  int ranks = 1;  // ranks per site = connections per site pair before lanes
  int lanes = 1;  // connections per rank pair
  Pattern pattern = Pattern::AllToAll;
  // The exchanges smallest_h may choose from (empty: `pattern` only); at equal H the earlier.
  std::vector<Pattern> search_patterns;
  // Round trips per exchange round; < 0: derived per sync from eager_bytes (see above).
  double rtts_per_round = -1;
  // The transport's eager size (transport.eager_bytes): a message at most this long per
  // (rank, peer) pair arrives half a round trip after it leaves.
  double eager_bytes = 8.0 * (1 << 20);
  // Round trips the weight-hash check (outer.check_hash) adds to a sync. 0: geoloco posts a
  // round's check and verifies it at the fragment's next round, so it waits for nothing on
  // the sync path (before 2026-12-01 it waited: one small exchange, 0.5).
  double check_rtts = 0;
  // Site-local time of one full-model sync outside the network: encode, decode of every
  // site's frame, outer step, copies (measured: a sync over a zero-latency, unlimited link).
  // A fragment sync pays local_sync_s / F. 0: not modelled.
  double local_sync_s = 0;
  // Measured per codec bit width (outer.plan: auto, local_cost.hpp): overrides local_sync_s
  // for the widths it holds.
  std::map<int, double> local_sync_s_by_bits;
  double local_sync_for(int bits) const {
    const auto it = local_sync_s_by_bits.find(bits);
    return it != local_sync_s_by_bits.end() ? it->second : local_sync_s;
  }
  bool slow_start = false;
  double initial_window_bytes = 10 * 1448;  // Linux initcwnd 10 segments of 1448 bytes
  double dp_bytes_per_value = 2;            // per-step DDP across sites ships bf16 gradients

  // Target search.
  double target_utilization = 0.95;
  int64_t h_floor = 25;  // quality floor (FINDINGS.md: H=10 clearly worse than 25-50)
  int64_t h_max = 100000;
  std::vector<int> search_bits{16, 8, 4, 2};  // preferred first
  std::vector<int> search_fragments{1, 2, 4, 8, 16};
  std::vector<int> search_lanes{1, 2, 4, 8, 16, 32, 64};

  // Site WAN capacity (bytes/s): rate x links, lowered to the probe's N-connection figure
  // when that measurement was itself link-bound.
  double site_capacity_Bps() const;
  // Per-connection ceiling: the probe's figure if present, else window / RTT.
  double per_connection_cap_Bps() const;

  // Reads a budget document (format/version header, then model, compression, sites, link,
  // measured, schedule, target); every key validated, unknown keys rejected.
  static BudgetInput from_yaml(const config::Node& root);
  void validate() const;  // InputError on inconsistent values
};

// One fragment sync for one site.
struct SyncCost {
  double payload_bytes = 0;  // this site's compressed fragment
  double egress_bytes = 0;   // what the site sends for it
  int64_t connections = 0;   // connections that carry it concurrently
  double per_connection_cap_Bps = 0;
  double rate_Bps = 0;     // effective
  bool bdp_bound = false;  // connections x cap < link capacity
  int64_t rounds = 0;
  double message_bytes = 0;   // one rank's message to one peer in a round
  double rtts_per_round = 0;  // effective (given, or from eager_bytes)
  double bandwidth_s = 0;
  double latency_s = 0;     // rounds x rtts_per_round x RTT + check_s
  double check_s = 0;       // of latency_s: the weight-hash check, check_rtts x RTT
  double slow_start_s = 0;  // extra over steady state
  double local_s = 0;       // local_sync_s / F: codec, outer step, copies
  double total_s = 0;       // bandwidth + latency + slow start + local
};

// `bits` (0: unknown) picks local_sync_s_by_bits' entry for the codec's own cost.
SyncCost sync_cost(const BudgetInput& in, double bytes_per_value, int fragments, int lanes, int bits = 0);

struct Evaluation {
  int64_t H = 0;
  Pattern pattern = Pattern::AllToAll;
  int bits = 0;  // 0: bytes_per_value was given (compression.bytes_per_value), not priced from bits
  double bytes_per_value = 0;
  int fragments = 0;
  int lanes = 0;
  SyncCost fragment_sync;
  double compute_s = 0;      // H x step time
  double hide_window_s = 0;  // overlap_steps x step time, per fragment
  double exposed_s = 0;      // per H steps
  double utilization = 0;
};

// Utilization for given (H, bytes per value, fragments, lanes); bits is only reported.
Evaluation evaluate(const BudgetInput& in, int64_t H, int bits, double bytes_per_value, int fragments, int lanes);

// Exposed wait per H steps and utilization, the overlap model alone (pure arithmetic).
double exposed_wait_s(int64_t H, double step_s, int fragments, int64_t overlap_steps, double fragment_sync_s);
double utilization(int64_t H, double step_s, double exposed_s);

struct HSearch {
  bool found = false;
  Evaluation best;     // the answer, or the best reached at h_max when not found
  std::string reason;  // why not found
};

// Smallest H in [max(h_floor, overlap_steps, fragments), h_max] for which some (bits,
// fragments, lanes, pattern) from the search lists reaches target_utilization. Ties at the
// smallest H prefer the earlier bits in the list (higher precision), then fewer fragments, then
// fewer lanes, then the earlier pattern. Utilization is non-decreasing in H for a fixed configuration, so each
// configuration is bisected.
HSearch smallest_h(const BudgetInput& in);

struct BudgetReport {
  BudgetInput input;
  Evaluation current;        // the configuration as given
  SyncCost full_sync;        // the whole model at once (F=1), for the table
  SyncCost ring_full_sync;   // ring all-reduce of the whole model, for comparison
  SyncCost owner_full_sync;  // outer.exchange: owner, the whole model, for comparison
  double window_bytes = 0;
  int64_t connections_to_fill_link = 0;  // at the window's cap
  double rmem_to_fill_link = 0;          // per connection, with the current connections
  double dp_bytes_per_period = 0;        // per-step DDP across sites, per site, per H steps
  double geoloco_bytes_per_period = 0;   // this plan, per site, per H steps
  double dp_step_comm_s = 0;             // per-step DDP all-reduce over the WAN
  double dp_utilization = 0;
  HSearch search;
};

BudgetReport plan_budget(const BudgetInput& in);

// What `geoloco probe` measures on a path; 0 (or absent) fields are not written.
struct MeasuredPath {
  double rtt_median_ms = 0;
  double rtt_p99_ms = 0;
  double per_connection_gbps = 0;
  int64_t connections = 0;  // connections used for connections_gbps
  double connections_gbps = 0;
  double step_time_s = 0;
  std::optional<double> retransmit_pct;  // TCP retransmitted segments, % of segments sent
};
// The `measured:` section as YAML text, values written so that they read back bit-exact
// through BudgetInput::from_yaml. Append it to a budget document (or to the header
// `format: geoloco-budget\nversion: 1\n` plus model/link/schedule sections).
std::string measured_yaml(const MeasuredPath& m);

}  // namespace geoloco::planner

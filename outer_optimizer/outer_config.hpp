// OuterConfig: the `outer:` section -- how sites synchronize (DiLoCo).
//
//   outer:
//     interval: 100                 # H: inner steps between syncs
//     optimizer: {kind: nesterov, lr: 0.7, momentum: 0.9}   # sgd | nesterov | adam
//     compression: {codec: int8, block: 128, error_feedback: true, zstd_level: 3}
//     weighting: uniform            # uniform | tokens (each site weighted by tokens processed)
//     exchange: all_to_all          # all_to_all | owner: each site owns 1/S of every shard
//                                   # (owner_exchange.hpp; needs min_sites = every site) |
//                                   # auto: plan: auto picks one with the budget model
//     quantize_on: auto             # auto | device | host: where a GPU site quantizes its pseudo-gradient
//                                   # (device_outer.hpp; same frames either way)
//     pace: steps                   # steps | time: a slower site trains fewer steps per round (pace.hpp)
//     pace_tolerance: 0.05          # pace: time: a site this close to the fastest trains every step
//     inner_state: keep             # keep | reset (AdamW moments after each outer step)
//     check_hash: true              # compare global-weight hashes across sites every sync
//     fragments: 1                  # F: streaming fragments (1 <= F <= n_layer, F <= interval)
//     overlap_steps: 0              # tau: inner steps a sync runs behind compute (0: blocking)
//     merge_alpha: 0.5              # overlap merge: local <- alpha * local + (1 - alpha) * global
//     delayed_update: false         # apply round t's outer update at round t+1 (tau = interval)
//     plan: manual                  # manual | auto: probe, time the steps, choose H/F/codec (auto_plan.hpp)
//     target_utilization: 0.95      # what plan: auto aims for
//     plan_measure_steps: 5         # inner steps timed before the plan (no sync before it)
//     plan_probe_seconds: 1.0       # per probe stream (one connection, all lanes)
//     replan_threshold: 0.5         # re-plan when measured sync/step time drifts by more than this
//     plan_h_min: 25                # H range the plan searches (quality floor: FINDINGS.md)
//     plan_h_max: 5000
//     plan_bits: [16, 8, 4]         # codecs the plan may pick (16 fp16, 8 int8, 4 int4, 2 int2)
//     min_sites: 0                  # quorum: sites a round needs (0: a majority of the config's)
//     deadline_s: 0                 # how long a round waits for a site (0: auto, from recent rounds)
//     deadline_floor_s: 30          # auto deadline: at least this
//     quorum_wait_s: 60             # below quorum: wait this long for a decision, then exit 1
//     consensus_retry_s: 1.0        # membership ballots: patience before the next one
//     allow_join: true              # a restarted or new site may join the running job
//     join_wait_s: 300              # a joiner waits this long to be taken in and get the state
//     join_chunk_bytes: 4194304     # the state travels in chunks of this size, each checksummed
//     join_warmup_steps: -1         # a joiner's inner lr ramps up over this many steps (-1: outer.interval)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "compression/config.hpp"
#include "core/config_node.hpp"

namespace geoloco::outer {

// Every choice of the section, parsed once (from_yaml) into an enum; name() gives the YAML word
// back (summaries, logs).
enum class OuterOptimizerKind : uint8_t { Sgd, Nesterov, Adam, SparseLoco };
enum class Weighting : uint8_t { Uniform, Tokens };
enum class ExchangeKind : uint8_t { AllToAll, Owner, Auto };
enum class QuantizeOn : uint8_t { Auto, Device, Host };
enum class PaceKind : uint8_t { Steps, Time };
enum class InnerState : uint8_t { Keep, Reset };
enum class PlanKind : uint8_t { Manual, Auto };
const char* name(OuterOptimizerKind k);
const char* name(Weighting w);
const char* name(ExchangeKind e);
const char* name(QuantizeOn q);
const char* name(PaceKind p);
const char* name(InnerState s);
const char* name(PlanKind p);

struct OuterOptimizerConfig {
  OuterOptimizerKind kind = OuterOptimizerKind::Nesterov;
  double lr = 0.7;
  double momentum = 0.9;                          // sgd (heavy ball when > 0) and nesterov
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // adam
  // sparseloco: the error-feedback accumulator's decay (outer.compression.error_feedback_decay)
  // stands in for the outer momentum; the step is global -= lr * average.
  double ef_decay = 0.95;

  static OuterOptimizerConfig from_yaml(const config::Node& node);
};

struct OuterConfig {
  bool enabled = false;    // true when the section is present
  int64_t interval = 100;  // H
  OuterOptimizerConfig optimizer;
  compression::PipelineConfig compression;
  Weighting weighting = Weighting::Uniform;
  // all_to_all: every rank sends its shard to every other site ((S-1) shards out per round).
  // owner: each site owns 1/S of every segment; its owner averages and sends it back
  // (2(S-1)/S shards out per round, two phases: owner_exchange.hpp).
  ExchangeKind exchange = ExchangeKind::AllToAll;
  // Where a GPU site's round is quantized (device_outer.hpp): auto (the device
  // when the codec is int8/int4/fp4/int2 without top-k, else the host), device (the same,
  // refused for a codec the device cannot make), host (the fp32 shard staged to the host).
  // The frames are the same bytes either way. CPU sites always quantize on the host.
  QuantizeOn quantize_on = QuantizeOn::Auto;
  PaceKind pace = PaceKind::Steps;  // steps | time (outer_optimizer/pace.hpp)
  double pace_tolerance = 0.05;
  InnerState inner_state = InnerState::Keep;
  bool check_hash = true;
  int fragments = 1;          // F: streaming fragments, each synced at its own offset
  int64_t overlap_steps = 0;  // tau, 0 <= tau < interval
  double merge_alpha = 0.5;
  bool delayed_update = false;
  PlanKind plan = PlanKind::Manual;
  double target_utilization = 0.95;
  int64_t plan_measure_steps = 5;
  double plan_probe_seconds = 1.0;
  double replan_threshold = 0.5;
  int64_t plan_h_min = 25, plan_h_max = 5000;
  std::vector<int> plan_bits{16, 8, 4};
  // Membership (docs/elastic.md).
  int min_sites = 0;  // 0: a majority of the sites in the config (resolved by quorum())
  double deadline_s = 0;
  double deadline_floor_s = 30;
  double quorum_wait_s = 60;
  double consensus_retry_s = 1.0;
  bool allow_join = true;
  double join_wait_s = 300;
  int64_t join_chunk_bytes = 4 << 20;
  // A joiner's fresh inner optimizer: its lr ramps linearly over these steps from the join
  // (0 or 1: none). from_yaml resolves the default, -1, to outer.interval (bench/elastic/rewarm.sh:
  // a ramp over one period brings a joiner's first pseudo-gradient to the size of the others').
  int64_t join_warmup_steps = -1;
  bool auto_plan() const { return plan == PlanKind::Auto; }
  bool pace_by_time() const { return pace == PaceKind::Time; }
  bool owner_exchange() const { return exchange == ExchangeKind::Owner; }
  bool exchange_auto() const { return exchange == ExchangeKind::Auto; }
  int quorum(int sites) const { return min_sites > 0 ? min_sites : sites / 2 + 1; }
  bool overlapped() const { return overlap_steps > 0 || delayed_update; }

  static OuterConfig from_yaml(const config::Node& node);
};

// Whether a GPU site can quantize frames of this config on the device (outer.quantize_on):
// the dense scaled codecs int8, int4, fp4 and int2, without top-k.
bool device_quantizable(const compression::PipelineConfig& p);

}  // namespace geoloco::outer

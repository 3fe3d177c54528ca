// The `outer:` config section (outer_config.hpp).
#include "outer_optimizer/outer_config.hpp"

#include <fmt/format.h>

#include <array>
#include <string>
#include <vector>

namespace geoloco::outer {

namespace {

constexpr std::array<const char*, 4> kOptimizers{"sgd", "nesterov", "adam", "sparseloco"};
constexpr std::array<const char*, 2> kWeightings{"uniform", "tokens"};
constexpr std::array<const char*, 3> kExchanges{"all_to_all", "owner", "auto"};
constexpr std::array<const char*, 3> kQuantizeOn{"auto", "device", "host"};
constexpr std::array<const char*, 2> kPaces{"steps", "time"};
constexpr std::array<const char*, 2> kInnerStates{"keep", "reset"};
constexpr std::array<const char*, 2> kPlans{"manual", "auto"};

}  // namespace

const char* name(OuterOptimizerKind k) { return kOptimizers.at(static_cast<size_t>(k)); }
const char* name(Weighting w) { return kWeightings.at(static_cast<size_t>(w)); }
const char* name(ExchangeKind e) { return kExchanges.at(static_cast<size_t>(e)); }
const char* name(QuantizeOn q) { return kQuantizeOn.at(static_cast<size_t>(q)); }
const char* name(PaceKind p) { return kPaces.at(static_cast<size_t>(p)); }
const char* name(InnerState s) { return kInnerStates.at(static_cast<size_t>(s)); }
const char* name(PlanKind p) { return kPlans.at(static_cast<size_t>(p)); }

OuterOptimizerConfig OuterOptimizerConfig::from_yaml(const config::Node& n) {
  using K = OuterOptimizerKind;
  OuterOptimizerConfig c;
  c.kind = n.get_enum("kind", c.kind, kOptimizers);
  c.lr = n.get_double("lr", c.kind == K::Adam ? 1e-3 : c.kind == K::SparseLoco ? 1.0 : c.lr, 0.0, 100.0);
  if (c.kind == K::SparseLoco) {
    // SparseLoCo (Sarfi et al. 2025): no outer momentum; the decayed error feedback is it.
    if (n.has("momentum")) n.fail("momentum", "not used by sparseloco (its error feedback decays by ef_decay)");
    c.momentum = 0.0;
    c.ef_decay = n.get_double("ef_decay", c.ef_decay, 0.0, 1.0);
    if (!(c.ef_decay > 0.0)) n.fail_value("ef_decay", "a number in (0, 1]");
  } else {
    if (n.has("ef_decay")) n.fail("ef_decay", "applies only to kind sparseloco");
    c.momentum = n.get_double("momentum", c.kind == K::Sgd ? 0.0 : c.momentum, 0.0, 0.999999);
  }
  if (n.has("betas")) {
    auto b = n.get<std::vector<double>>("betas", {});
    if (b.size() != 2 || !(b[0] >= 0 && b[0] < 1) || !(b[1] >= 0 && b[1] < 1))
      n.fail_value("betas", "a list of two numbers in [0, 1), e.g. [0.9, 0.999]");
    c.beta1 = b[0];
    c.beta2 = b[1];
  }
  c.eps = n.get_double("eps", c.eps, 0.0, 1.0);
  if (c.kind == K::Adam && n.has("momentum")) n.fail("momentum", "not used by adam (set betas)");
  n.finish();
  return c;
}

bool device_quantizable(const compression::PipelineConfig& p) {
  return !p.topk && compression::codec_has_scales(p.codec);  // int8, int4, fp4, int2
}

OuterConfig OuterConfig::from_yaml(const config::Node& n) {
  OuterConfig c;
  c.enabled = true;
  c.interval = n.get_int("interval", c.interval, 1, int64_t{1} << 40);
  c.optimizer = OuterOptimizerConfig::from_yaml(n.child("optimizer"));
  c.compression = compression::PipelineConfig::from_yaml(n.child("compression"));
  if (c.optimizer.kind == OuterOptimizerKind::SparseLoco) {
    // Its momentum is the error-feedback accumulator of sparsified pseudo-gradients.
    if (!c.compression.error_feedback || !c.compression.topk)
      n.child("optimizer")
          .fail("kind",
                "sparseloco sends top-k sparsified pseudo-gradients with error feedback "
                "(its momentum): set outer.compression.topk (e.g. 0.02) and "
                "error_feedback: true");
    if (n.child("compression").has("error_feedback_decay"))
      n.child("compression").fail("error_feedback_decay", "set by outer.optimizer.ef_decay with kind sparseloco");
    c.compression.error_feedback_decay = c.optimizer.ef_decay;
  }
  c.weighting = n.get_enum("weighting", c.weighting, kWeightings);
  c.exchange = n.get_enum("exchange", c.exchange, kExchanges);
  c.quantize_on = n.get_enum("quantize_on", c.quantize_on, kQuantizeOn);
  c.pace = n.get_enum("pace", c.pace, kPaces);
  c.pace_tolerance = n.get_double("pace_tolerance", c.pace_tolerance, 0.0, 0.9);
  if (c.pace_by_time() && c.weighting != Weighting::Tokens)
    n.fail("pace",
           "time lets a slower site train fewer inner steps per round, so its pseudo-gradient must "
           "weigh by the tokens it trained: set outer.weighting: tokens");
  if (!c.pace_by_time() && n.has("pace_tolerance")) n.fail("pace_tolerance", "only used with pace: time");
  c.inner_state = n.get_enum("inner_state", c.inner_state, kInnerStates);
  c.check_hash = n.get<bool>("check_hash", c.check_hash);
  c.fragments = static_cast<int>(n.get_int("fragments", c.fragments, 1, 1 << 20));
  if (c.fragments > c.interval)
    n.fail_value("fragments",
                 fmt::format("an integer from 1 to interval ({}): fragments sync at distinct steps", c.interval));
  c.overlap_steps = n.get_int("overlap_steps", c.overlap_steps, 0, int64_t{1} << 40);
  // tau >= H would put two rounds of one shard in flight: their snapshots would overlap.
  if (c.overlap_steps >= c.interval)
    n.fail_value("overlap_steps", fmt::format("an integer below interval ({})", c.interval));
  c.merge_alpha = n.get_double("merge_alpha", c.merge_alpha, 0.0, 1.0);
  c.delayed_update = n.get<bool>("delayed_update", c.delayed_update);
  if (c.delayed_update && c.overlap_steps > 0)
    n.fail("overlap_steps", "delayed_update already overlaps a whole interval; leave overlap_steps at 0");
  c.plan = n.get_enum("plan", c.plan, kPlans);
  c.target_utilization = n.get_double("target_utilization", c.target_utilization, 0.01, 0.99999);
  c.plan_measure_steps = n.get_int("plan_measure_steps", c.plan_measure_steps, 2, 100000);
  c.plan_probe_seconds = n.get_double("plan_probe_seconds", c.plan_probe_seconds, 0.05, 600.0);
  c.replan_threshold = n.get_double("replan_threshold", c.replan_threshold, 0.0, 1000.0);
  c.plan_h_min = n.get_int("plan_h_min", c.plan_h_min, 1, int64_t{1} << 30);
  c.plan_h_max = n.get_int("plan_h_max", c.plan_h_max, 1, int64_t{1} << 30);
  if (c.plan_h_max < c.plan_h_min) n.fail_value("plan_h_max", fmt::format("at least plan_h_min ({})", c.plan_h_min));
  if (n.has("plan_bits")) {
    c.plan_bits = n.get<std::vector<int>>("plan_bits", {});
    if (c.plan_bits.empty()) n.fail_value("plan_bits", "a non-empty list of 32, 16, 8, 4, 2");
    for (int b : c.plan_bits)
      if (b != 32 && b != 16 && b != 8 && b != 4 && b != 2)
        n.fail_value("plan_bits", "a non-empty list of 32, 16, 8, 4, 2");
  }
  c.min_sites = static_cast<int>(n.get_int("min_sites", c.min_sites, 0, 64));
  c.deadline_s = n.get_double("deadline_s", c.deadline_s, 0.0, 1e6);
  c.deadline_floor_s = n.get_double("deadline_floor_s", c.deadline_floor_s, 0.001, 1e6);
  c.quorum_wait_s = n.get_double("quorum_wait_s", c.quorum_wait_s, 0.01, 1e7);
  c.consensus_retry_s = n.get_double("consensus_retry_s", c.consensus_retry_s, 0.001, 600.0);
  c.allow_join = n.get<bool>("allow_join", c.allow_join);
  c.join_wait_s = n.get_double("join_wait_s", c.join_wait_s, 0.1, 1e7);
  c.join_chunk_bytes = n.get_int("join_chunk_bytes", c.join_chunk_bytes, 4096, 256 << 20);
  c.join_warmup_steps = n.get_int("join_warmup_steps", c.join_warmup_steps, -1, int64_t{1} << 40);
  if (c.join_warmup_steps < 0) c.join_warmup_steps = c.interval;
  if (c.auto_plan() && c.overlap_steps + 1 > c.plan_h_max)
    n.fail("plan_h_max", fmt::format("must exceed overlap_steps ({})", c.overlap_steps));
  if (c.exchange_auto() && !c.auto_plan())
    n.fail("exchange",
           "auto is chosen by the plan from the measured link: set outer.plan: auto, or exchange: "
           "all_to_all | owner");
  if (c.quantize_on == QuantizeOn::Device) {
    if (c.compression.topk)
      n.fail("quantize_on",
             "device quantizes dense blocks (int8, int4, fp4, int2): remove compression.topk or "
             "set quantize_on: auto | host");
    if (!c.auto_plan() && !device_quantizable(c.compression))
      n.fail("quantize_on", fmt::format("the device quantizes int8, int4, fp4 and int2, not {}: set "
                                        "compression.codec to one of them, or quantize_on: auto | host",
                                        compression::codec_name(c.compression.codec)));
    if (c.auto_plan())
      for (int b : c.plan_bits)
        if (b > 8)
          n.fail("quantize_on", fmt::format("plan: auto may pick {} bits, which the device does not quantize: "
                                            "set plan_bits to 8, 4 and 2 only, or quantize_on: auto | host",
                                            b));
  }
  if (c.auto_plan() && c.compression.topk)
    n.fail("plan", "auto picks a dense codec (fp16/int8/int4/int2): remove compression.topk or use plan: manual");
  if (c.auto_plan() && c.inner_state == InnerState::Reset)
    n.fail("plan", "auto may choose fragments > 1, which excludes inner_state: reset");
  if (c.fragments > 1 && c.inner_state == InnerState::Reset)
    n.fail("inner_state",
           "reset needs fragments: 1 (a fragment's sync covers only part of the model, the AdamW state "
           "covers all of it)");
  n.finish();
  return c;
}

}  // namespace geoloco::outer

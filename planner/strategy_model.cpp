#include "planner/strategy_model.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "planner/quantity.hpp"
#include "core/error.hpp"

namespace geoloco::planner {
namespace {

// One link (ring) processing collectives in issue order.
struct LinkQueue {
  double free_at = 0;
  double busy = 0;
  double submit(double ready, double duration) {
    free_at = std::max(ready, free_at) + duration;
    busy += duration;
    return free_at;
  }
};

struct RingSpec {
  int n = 1;
  double bw = 0;
  double lat = 0;
};

double ag(double bytes, const RingSpec& r) { return all_gather_s(bytes, r.n, r.bw, r.lat); }
double ar(double bytes, const RingSpec& r) { return all_reduce_s(bytes, r.n, r.bw, r.lat); }

struct Timing {
  double comm = 0, exposed = 0;
};

// Gradient buckets become ready evenly through a backward pass and are reduced in turn while
// compute goes on. With gradient accumulation, ddp and zero1 reduce only in the last
// micro-batch (no_sync before it); zero2 keeps sharded gradients and so reduces in every one.
// `after_s` runs once compute and reductions are done (zero's parameter all-gather).
Timing bucketed_backward(const Workload& w, double bucket_op_s_total, int buckets, bool every_micro, double after_s) {
  const int k = w.micro_batches;
  const double fwd = w.compute_s * w.forward_fraction / k;
  const double bwd = (w.compute_s - w.compute_s * w.forward_fraction) / k;
  LinkQueue link;
  double t = 0, done = 0;
  for (int m = 0; m < k; ++m) {
    t += fwd;
    const double bwd_start = t;
    t += bwd;
    if (!every_micro && m + 1 < k) continue;
    for (int b = 0; b < buckets; ++b)
      done = link.submit(bwd_start + bwd * (b + 1) / buckets, bucket_op_s_total / buckets);
  }
  const double end = link.submit(std::max(t, done), after_s);
  return {link.busy, end - w.compute_s};
}

// FSDP's per-layer schedule on `inner` (the sharding group), for every micro-batch: compute
// of a layer waits for its parameters' all-gather. With `cross`, each layer's gradient shard
// is then all-reduced over the replicas on a separate link (hybrid sharding).
Timing fsdp_schedule(const Workload& w, int layers, const RingSpec& inner, const RingSpec* cross, int shard) {
  const double unit = w.params / layers;
  const double ag_s = ag(unit * w.param_bytes, inner);
  const double rs_s = ag(unit * w.grad_bytes, inner);  // reduce-scatter moves what all-gather does
  const double cross_s = cross ? ar(unit * w.grad_bytes / shard, *cross) : 0.0;
  const int k = w.micro_batches;
  const double f = w.compute_s * w.forward_fraction / layers / k;
  const double b = (w.compute_s - w.compute_s * w.forward_fraction) / layers / k;
  LinkQueue link, xlink;
  std::vector<double> gathered(static_cast<size_t>(layers));
  double t = 0, last = 0;
  for (int m = 0; m < k; ++m) {
    // Forward: the next layer's gather is issued when a layer starts (one in flight ahead).
    gathered[0] = link.submit(t, ag_s);
    for (int l = 0; l < layers; ++l) {
      const double start = std::max(t, gathered[static_cast<size_t>(l)]);
      if (l + 1 < layers) gathered[static_cast<size_t>(l + 1)] = link.submit(start, ag_s);
      t = start + f;
    }
    // Backward, last layer first: gather again (parameters were freed after forward),
    // prefetch the previous layer, reduce-scatter gradients when the layer's backward ends.
    gathered[static_cast<size_t>(layers - 1)] = link.submit(t, ag_s);
    for (int l = layers - 1; l >= 0; --l) {
      const double start = std::max(t, gathered[static_cast<size_t>(l)]);
      if (l > 0) gathered[static_cast<size_t>(l - 1)] = link.submit(start, ag_s);
      t = start + b;
      const double rs_done = link.submit(t, rs_s);
      last = std::max(last, rs_done);
      if (cross) last = std::max(last, xlink.submit(rs_done, cross_s));
    }
  }
  const double end = std::max(t, last);
  return {link.busy + xlink.busy, end - w.compute_s};
}

std::string gb(double bytes) { return fmt::format("{:.1f} GB", bytes / 1e9); }
std::string gbs(double Bps) { return fmt::format("{:.3g} GB/s", Bps / 1e9); }

}  // namespace

const char* strategy_name(Strategy s) {
  switch (s) {
    case Strategy::DDP: return "ddp";
    case Strategy::Zero1: return "zero1";
    case Strategy::Zero2: return "zero2";
    case Strategy::FSDP: return "fsdp";
    case Strategy::Hybrid: return "hybrid";
  }
  return "?";
}

const StrategyCost& TopoPlan::cost(Strategy s) const {
  for (const auto& c : costs)
    if (c.strategy == s) return c;
  throw Error(fmt::format("no cost for strategy {}", strategy_name(s)));
}

double all_reduce_s(double bytes, int n, double bandwidth_Bps, double hop_latency_s) {
  if (n <= 1) return 0.0;
  return 2.0 * (n - 1) * (hop_latency_s + bytes / n / bandwidth_Bps);
}

double all_gather_s(double bytes, int n, double bandwidth_Bps, double hop_latency_s) {
  if (n <= 1) return 0.0;
  return (n - 1) * (hop_latency_s + bytes / n / bandwidth_Bps);
}

Strategy recommend(const std::vector<StrategyCost>& costs, std::span<const Strategy> allowed) {
  auto ok = [&](const StrategyCost& c) {
    return std::find(allowed.begin(), allowed.end(), c.strategy) != allowed.end();
  };
  const StrategyCost* fastest = nullptr;
  for (const auto& c : costs)
    if (ok(c) && c.fits && (!fastest || c.step_s < fastest->step_s)) fastest = &c;
  if (!fastest) {
    const StrategyCost* least = nullptr;
    for (const auto& c : costs)
      if (ok(c) && (!least || c.memory_bytes < least->memory_bytes)) least = &c;
    GEOLOCO_CHECK(least != nullptr, "recommend: no strategy allowed");
    return least->strategy;
  }
  const StrategyCost* pick = fastest;
  for (const auto& c : costs)
    if (ok(c) && c.fits && c.step_s <= 1.05 * fastest->step_s && c.memory_bytes < pick->memory_bytes) pick = &c;
  return pick->strategy;
}

TopoPlan plan_topology(const Topology& topo, const Workload& w_in) {
  Workload w = w_in;
  if (!(w.params >= 1)) throw InputError(fmt::format("topo: params: got {}, expected >= 1", w.params));
  if (!(w.compute_s > 0)) throw InputError(fmt::format("topo: step compute time: got {} s, expected > 0", w.compute_s));
  if (!(w.gpu_memory_bytes > 0)) throw InputError("topo: GPU memory must be > 0");
  if (w.activation_bytes < 0) throw InputError("topo: activation memory must be >= 0");
  if (w.layers <= 0) w.layers = 32;
  if (!(w.bucket_bytes > 0)) throw InputError("topo: bucket size must be > 0");
  if (w.micro_batches < 1) throw InputError(fmt::format("topo: micro-batches: got {}, expected >= 1", w.micro_batches));

  TopoPlan p;
  p.topology = topo.name();
  p.gpus = topo.gpus();
  p.workload = w;
  p.islands = topo.nvlink_islands();
  const int G = topo.gpus();
  const double N = w.params;

  RingSpec all{G, 0, 0};
  if (G > 1) {
    std::vector<int> members(static_cast<size_t>(G));
    for (int i = 0; i < G; ++i) members[static_cast<size_t>(i)] = i;
    auto ring = topo.best_ring(members);
    all.bw = ring.bandwidth_Bps;
    all.lat = ring.latency_s;
    p.ring_bandwidth_Bps = ring.bandwidth_Bps;
    p.ring_bottleneck = ring.bottleneck;
  }

  // Islands for hybrid: must be of equal size to shard evenly.
  const size_t I = p.islands.front().size();
  bool uniform = std::all_of(p.islands.begin(), p.islands.end(), [&](const auto& is) { return is.size() == I; });
  RingSpec island{static_cast<int>(I), 0, 0}, cross{static_cast<int>(p.islands.size()), 0, 0};
  if (uniform && I > 1) {
    double bw = 1e300, lat = 0;
    for (const auto& is : p.islands) {
      auto r = topo.best_ring(is);
      if (r.bandwidth_Bps < bw) bw = r.bandwidth_Bps, lat = r.latency_s;
    }
    island.bw = bw, island.lat = lat;
    p.island_ring_bandwidth_Bps = bw;
  }
  if (uniform && p.islands.size() > 1) {
    double bw = 1e300, lat = 0;
    for (size_t j = 0; j < I; ++j) {
      std::vector<int> members;
      for (const auto& is : p.islands) members.push_back(is[j]);
      auto r = topo.best_ring(members);
      if (r.bandwidth_Bps < bw) bw = r.bandwidth_Bps, lat = r.latency_s;
    }
    cross.bw = bw, cross.lat = lat;
    p.cross_ring_bandwidth_Bps = bw;
  }

  const double full_state = w.param_bytes + w.grad_bytes + w.optimizer_bytes;  // per parameter
  const double grads = N * w.grad_bytes;
  const int buckets = std::max(1, static_cast<int>(std::ceil(grads / w.bucket_bytes)));
  const double working_set = (2 * w.param_bytes + w.grad_bytes) * N / w.layers;  // gathered + prefetched layer

  for (Strategy s : kAllStrategies) {
    StrategyCost c;
    c.strategy = s;
    Timing t;
    switch (s) {
      case Strategy::DDP:
        t = bucketed_backward(w, ar(grads, all), buckets, false, 0.0);
        c.memory_bytes = N * full_state;
        break;
      case Strategy::Zero1:
      case Strategy::Zero2:
        t = bucketed_backward(w, ag(grads, all), buckets, s == Strategy::Zero2, ag(N * w.param_bytes, all));
        c.memory_bytes = s == Strategy::Zero1 ? N * (w.param_bytes + w.grad_bytes) + N * w.optimizer_bytes / G
                                              : N * w.param_bytes + N * (w.grad_bytes + w.optimizer_bytes) / G;
        break;
      case Strategy::FSDP:
        t = G > 1 ? fsdp_schedule(w, w.layers, all, nullptr, 1) : Timing{};
        c.memory_bytes = N * full_state / G + working_set;
        break;
      case Strategy::Hybrid:
        if (!uniform) {
          c.note = "NVLink islands differ in size: hybrid not modelled, shown as fsdp";
          t = G > 1 ? fsdp_schedule(w, w.layers, all, nullptr, 1) : Timing{};
          c.memory_bytes = N * full_state / G + working_set;
        } else if (I == 1) {
          c.note = "no NVLink islands: hybrid replicates on every GPU, i.e. ddp";
          t = bucketed_backward(w, ar(grads, all), buckets, false, 0.0);
          c.memory_bytes = N * full_state;
        } else if (p.islands.size() == 1) {
          c.note = "one NVLink island spans all GPUs: hybrid is fsdp";
          t = fsdp_schedule(w, w.layers, island, nullptr, 1);
          c.memory_bytes = N * full_state / G + working_set;
        } else {
          c.note = fmt::format("shard over {} GPUs per island, replicate over {} islands", I, p.islands.size());
          t = fsdp_schedule(w, w.layers, island, &cross, static_cast<int>(I));
          // geoloco's hybrid: parameters and gradients sharded over the island, the optimizer
          // state over every GPU (each rank updates its own site shard, trainer/loop/site_strategy.hpp).
          c.memory_bytes =
              N * (w.param_bytes + w.grad_bytes) / static_cast<double>(I) + N * w.optimizer_bytes / G + working_set;
        }
        break;
    }
    c.memory_bytes += w.activation_bytes;
    c.comm_s = t.comm;
    c.exposed_s = t.exposed;
    c.step_s = w.compute_s + t.exposed;
    c.fits = c.memory_bytes <= w.gpu_memory_bytes;
    p.costs.push_back(c);
  }

  const StrategyCost& ddp = p.cost(Strategy::DDP);
  const StrategyCost* pick = &p.cost(recommend(p.costs, kAllStrategies));
  if (!pick->fits) {
    p.recommended = pick->strategy;
    p.reason = fmt::format(
        "nothing fits in {} per GPU; {} needs the least ({}): add GPUs, shard activations "
        "(checkpointing) or shrink the micro-batch",
        gb(w.gpu_memory_bytes), strategy_name(pick->strategy), gb(pick->memory_bytes));
    return p;
  }
  const StrategyCost* fastest = nullptr;
  for (const auto& c : p.costs)
    if (c.fits && (!fastest || c.step_s < fastest->step_s)) fastest = &c;
  p.recommended = pick->strategy;
  std::string why;
  if (pick == fastest) {
    why = fmt::format("{} is the fastest strategy that fits ({} per step, {} per GPU)", strategy_name(pick->strategy),
                      format_seconds(pick->step_s), gb(pick->memory_bytes));
  } else {
    why = fmt::format("{} is within {:.1f}% of the fastest ({}) with {:.1f}x less memory ({} vs {} per GPU)",
                      strategy_name(pick->strategy), 100 * (pick->step_s / fastest->step_s - 1),
                      strategy_name(fastest->strategy), fastest->memory_bytes / pick->memory_bytes,
                      gb(pick->memory_bytes), gb(fastest->memory_bytes));
  }
  if (!ddp.fits) why += fmt::format("; ddp does not fit ({} > {})", gb(ddp.memory_bytes), gb(w.gpu_memory_bytes));
  const StrategyCost& fsdp = p.cost(Strategy::FSDP);
  if (pick->strategy != Strategy::FSDP && fsdp.step_s > 1.05 * pick->step_s)
    why += fmt::format("; fsdp would be {:.2f}x slower", fsdp.step_s / pick->step_s);
  if (G > 1) why += fmt::format("; slowest ring hop {} at {}", p.ring_bottleneck, gbs(p.ring_bandwidth_Bps));
  p.reason = why;
  return p;
}

std::string format_topo_table(const TopoPlan& p) {
  std::string out;
  out += fmt::format("topology {}: {} GPUs, {} NVLink island(s) of {}\n", p.topology, p.gpus, p.islands.size(),
                     p.islands.front().size());
  if (p.gpus > 1)
    out += fmt::format("  ring over all GPUs: {} (slowest hop {})\n", gbs(p.ring_bandwidth_Bps), p.ring_bottleneck);
  if (p.island_ring_bandwidth_Bps > 0 && p.islands.size() > 1)
    out += fmt::format("  ring inside an island: {}; across islands: {}\n", gbs(p.island_ring_bandwidth_Bps),
                       gbs(p.cross_ring_bandwidth_Bps));
  const Workload& w = p.workload;
  out += fmt::format(
      "  model {} parameters, {} layers; compute {} per step in {} micro-batch(es); {} GPU memory, "
      "{} activations\n\n",
      format_count(w.params), w.layers, format_seconds(w.compute_s), w.micro_batches, gb(w.gpu_memory_bytes),
      gb(w.activation_bytes));
  out += fmt::format("  {:<8} {:>10} {:>10} {:>10} {:>10} {:>12} {:>5}  {}\n", "strategy", "comm", "exposed", "step",
                     "vs ddp", "memory/GPU", "fits", "note");
  const double ddp_step = p.cost(Strategy::DDP).step_s;
  for (const auto& c : p.costs) {
    out += fmt::format("  {:<8} {:>10} {:>10} {:>10} {:>9.2f}x {:>12} {:>5}  {}\n", strategy_name(c.strategy),
                       format_seconds(c.comm_s), format_seconds(c.exposed_s), format_seconds(c.step_s),
                       c.step_s / ddp_step, gb(c.memory_bytes), c.fits ? "yes" : "no", c.note);
  }
  out += fmt::format("\nrecommended: {}\n  because {}\n", strategy_name(p.recommended), p.reason);
  return out;
}

nlohmann::json topo_json(const TopoPlan& p) {
  nlohmann::json j;
  j["format"] = "geoloco-topo-report";
  j["version"] = 1;
  j["topology"] = p.topology;
  j["gpus"] = p.gpus;
  j["islands"] = p.islands;
  j["ring_bandwidth_bytes_per_s"] = p.ring_bandwidth_Bps;
  j["ring_bottleneck"] = p.ring_bottleneck;
  j["island_ring_bandwidth_bytes_per_s"] = p.island_ring_bandwidth_Bps;
  j["cross_ring_bandwidth_bytes_per_s"] = p.cross_ring_bandwidth_Bps;
  j["workload"] = {{"params", p.workload.params},
                   {"layers", p.workload.layers},
                   {"compute_s", p.workload.compute_s},
                   {"micro_batches", p.workload.micro_batches},
                   {"gpu_memory_bytes", p.workload.gpu_memory_bytes},
                   {"activation_bytes", p.workload.activation_bytes}};
  for (const auto& c : p.costs) {
    j["strategies"].push_back({{"strategy", strategy_name(c.strategy)},
                               {"comm_s", c.comm_s},
                               {"exposed_s", c.exposed_s},
                               {"step_s", c.step_s},
                               {"memory_bytes", c.memory_bytes},
                               {"fits", c.fits},
                               {"note", c.note}});
  }
  j["recommended"] = strategy_name(p.recommended);
  j["reason"] = p.reason;
  return j;
}

}  // namespace geoloco::planner

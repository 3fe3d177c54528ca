// Site: the seam between an inner loop and geoloco's outer loop -- what the outer loop needs
// from one rank of a site, and nothing more. The outer loop owns it; an inner loop implements
// it: the native trainer (trainer/loop/native_site.hpp), a test double (tests/outer_optimizer/
// fake_site.hpp), a PyTorch loop or a pipeline stage next. Everything else the outer loop is
// told comes in its options (outer_options.hpp), built at the edge from a run's YAML.
//
//   identity      the rank within its site and the site's rank count (the site itself, and
//                 every other site, are in the options)
//   parameters    this rank's shard of the model's flat parameters: host values (read at a
//                 snapshot, overwritten by a merge), or a GPU site's device side (device());
//                 the model's tensors by name and offset are in the options (ModelParams), so
//                 fragments are cut by module
//   site exchange a small all-gather and sum among the site's ranks (the holdings vote and its
//                 verdict, plan boundaries, the pace, the site-wide hash), and the site's
//                 all-gather of the shard after a merge (shard_updated)
//   sinks         the trace of its phases, plan.json; metrics, rounds and the summary are
//                 taken by the driver (Diloco::metrics/take_rounds/summary), the checkpointed
//                 state by save_state/restore_state.
//
// Calls come from the thread that drives the outer loop (the inner loop's), every rank of a
// site at the same inner step: all_gather, sum and shard_updated are collectives.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "core/shard.hpp"
#include "core/trace.hpp"
#include "outer_optimizer/device_outer.hpp"

namespace geoloco::outer {

// One tensor of the model's flat parameter buffer.
struct ParamTensor {
  std::string name;
  int64_t offset = 0;  // elements into the flat buffer
  int64_t rows = 1;    // a matrix's rows (1 for a vector)
  int64_t cols = 0;    // elements per row
  // The repeated module it belongs to (a transformer block), or -1 outside them (embeddings,
  // the final norm): fragments take whole blocks, tables by rows (fragment_plan.hpp).
  int block = -1;
  int64_t numel() const { return rows * cols; }
};

// The model's parameters as the outer loop sees them: the tensors tile [0, total) in order.
struct ModelParams {
  int64_t total = 0;
  std::vector<ParamTensor> tensors;
  // The number of blocks (the largest block index + 1).
  int blocks() const;
  // Throws Error naming the first tensor out of order, overlapping, leaving a gap, or with a
  // negative size or block.
  void validate() const;
};

class Site {
 public:
  virtual ~Site() = default;

  virtual int rank() const = 0;   // within the site
  virtual int ranks() const = 0;  // the site's rank count

  // This rank's shard of the flat parameters: shard_of(total, rank(), ranks()).
  virtual ShardRange shard() const = 0;
  // Its values in host memory: read at a round's snapshot, overwritten by a merge (then
  // shard_updated() follows). On a GPU site a host mirror staged at each call.
  virtual std::span<float> shard_params() = 0;
  // After shard_params() was overwritten: the site's replica is made consistent again (the
  // all-gather of every rank's shard). Collective.
  virtual void shard_updated() = 0;
  // A GPU site's device side (device_outer.hpp), or null: rounds on the host.
  virtual DeviceOuter* device() { return nullptr; }
  // outer.inner_state: reset -- the inner optimizer's state is reset after a merge.
  virtual void reset_inner_state() {}

  // Every rank's bytes, in rank order (this rank's included). Collective; a one-rank site's
  // is its own.
  virtual std::vector<std::vector<std::byte>> all_gather(std::span<const std::byte> mine);
  // Element-wise sum over the site's ranks, in place. Collective.
  virtual void sum(std::span<double> values) { (void)values; }

  // Sinks: the rank's timeline (null: none) and, on the rank that writes it, every plan of
  // the run so far (outer.plan: auto; plan.json).
  virtual TraceRecorder* trace() { return nullptr; }
  virtual void write_plans(const nlohmann::json& plans) { (void)plans; }
};

}  // namespace geoloco::outer

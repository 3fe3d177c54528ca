// The inner optimizer of a site's ranks (`train.optimizer`).
//
// AdamW (Loshchilov & Hutter): decoupled weight decay, bias correction, fp32 moments.
// Matches torch.optim.AdamW: p *= 1 - lr*wd (decayed tensors only); m, v updated; then
// p -= lr * m_hat / (sqrt(v_hat) + eps).
//
// kind: muon (trainer/optim/muon.hpp): on the transformer blocks' weight matrices,
// m = mu m + (1 - mu) g, then with lr' = config.muon_lr(lr)
// p *= 1 - lr' wd;  p -= lr' * scale * NS(nesterov ? (1 - mu) g + mu m : m)
// and AdamW as above on every other tensor. Muon keeps its momentum in m (v stays zero on
// its matrices), so the state has AdamW's layout: checkpoints, joins and the outer loop's
// inner_state: reset treat both kinds alike.
//
// The optimizer owns its state for a contiguous range [begin, end) of the flat parameter
// buffer: the whole model under ddp, this rank's shard under zero1/zero2/fsdp/hybrid. A Muon
// matrix cut by the range needs the whole matrix's momentum update: the caller passes `gather`,
// which completes, in a full-layout buffer whose [begin, end) this rank wrote, every Muon
// matrix the ranks' ranges cut (muon_cut_parts: each part broadcast from the rank that owns it;
// a matrix inside one range needs nothing); every rank of the site then orthogonalizes each
// matrix its range touches (a cut matrix on every rank it spans, from the same bits, so to the
// same bits) and updates its own part.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "trainer/model/param_layout.hpp"
#include "trainer/optim/muon.hpp"
#include "trainer/optim/optimizer_config.hpp"

namespace geoloco::trainer {

// How an optimizer's range [begin, end) splits: the views intersected with it (merged where
// neighbours agree), each with AdamW's weight decay or not and whether Muon takes it; the
// Muon matrices the range touches; whether it cuts one of them (a step then needs a gather).
// The CPU and the CUDA optimizers share it.
struct OptimizerRange {
  int64_t begin, end;  // absolute offsets
  bool decay;
  bool muon;
};
struct OptimizerPlan {
  std::vector<OptimizerRange> ranges;
  std::vector<MuonMatrix> muon;
  bool needs_gather = false;
};
OptimizerPlan plan_optimizer(const OptimizerConfig& cfg, const ParamLayout& layout, int64_t begin, int64_t end);

// Under Muon on a site whose rank r's range is [bounds[r], bounds[r + 1]) (the ranges tile the
// buffer): the parts of every Muon matrix that more than one rank's range holds, each with the
// rank holding it, in layout order. Broadcasting each part from its rank completes every cut
// matrix on every rank: the whole of a sharded Muon step's gather (empty for AdamW, one rank,
// or no cut matrix).
struct GatherPart {
  int64_t offset = 0, count = 0;
  int root = 0;
};
std::vector<GatherPart> muon_cut_parts(const OptimizerConfig& cfg, const ParamLayout& layout,
                                       std::span<const int64_t> bounds);

class InnerOptimizer {
 public:
  InnerOptimizer(const OptimizerConfig& cfg, const ParamLayout& layout, int64_t begin, int64_t end);

  // Completes the Muon matrices cut by the ranks' ranges in a full-layout buffer (collective:
  // under Muon every rank of a sharded site calls it at every step).
  using Gather = std::function<void(std::span<float> full)>;

  // One update of params[begin, end) from grads[begin, end) (full-buffer spans: the
  // optimizer indexes them with absolute offsets). `lr` is the scheduled rate for this step.
  void step(std::span<float> params, std::span<const float> grads, double lr, const Gather& gather = {});
  // The same update on shard-sized buffers: params[i] and grads[i] hold element begin + i.
  void step_shard(std::span<float> params, std::span<const float> grads, double lr, const Gather& gather = {});

  const OptimizerConfig& config() const { return cfg_; }
  int64_t begin() const { return begin_; }
  int64_t end() const { return end_; }
  int64_t steps() const { return t_; }
  void set_steps(int64_t t) { t_ = t; }
  std::span<float> m() { return m_; }
  std::span<float> v() { return v_; }
  std::span<const float> m() const { return m_; }
  std::span<const float> v() const { return v_; }
  // Zeroes moments and the step count (outer loop option: reset inner state after a sync).
  void reset();
  // Under Muon: does the range cut a matrix (so that step needs `gather`)?
  bool needs_gather() const { return needs_gather_; }
  // Bytes of scratch the Muon step keeps between steps (the full-layout update buffer and
  // the Newton-Schulz work space).
  uint64_t scratch_bytes() const { return (update_.capacity() + ns_scratch_.capacity()) * sizeof(float); }

 private:
  OptimizerConfig cfg_;
  int64_t begin_, end_, total_;
  int64_t t_ = 0;
  std::vector<float> m_, v_;
  std::vector<OptimizerRange> ranges_;  // the views intersected with [begin, end)
  std::vector<MuonMatrix> muon_;        // the Muon matrices that intersect [begin, end)
  bool needs_gather_ = false;
  std::vector<float> update_;  // full layout: the momentum updates of the Muon matrices
  std::vector<float> ns_scratch_;

  // p, g point at element `begin_` of their buffers.
  void update(float* p, const float* g, double lr, const Gather& gather);
};

}  // namespace geoloco::trainer

// The inner optimizer's configuration (`train.optimizer`): AdamW everywhere, or Muon on the
// transformer blocks' 2-D weight matrices with AdamW on the rest (embeddings, biases,
// LayerNorm). Parsed and validated here; the update itself is trainer/optim/inner_optimizer.hpp.
#pragma once

#include <string>

#include "core/config_node.hpp"

namespace geoloco::trainer {

enum class OptimizerKind { AdamW, Muon };
const char* optimizer_kind_name(OptimizerKind k);

// How Muon scales the orthogonalized update of an [in, out] matrix (stored as HF Conv1D):
//   spectral  sqrt(max(1, out / in)) (Keller Jordan's reference), with a matrix lr near 0.02
//   rms       0.2 * sqrt(max(in, out)): the update's RMS is about AdamW's, so AdamW's lr
//             carries over as the matrix lr (Moonshot, "Muon is scalable for LLM training")
// On the small quality grid spectral at 0.02 beat rms at AdamW's lr by 20% (docs/quality.md).
enum class MuonScale { Spectral, Rms };

struct MuonConfig {
  double lr = 0.02;        // peak lr of the matrices (the schedule's factor applies, see muon_lr)
  double momentum = 0.95;  // m = momentum * m + (1 - momentum) * g
  bool nesterov = true;    // orthogonalize (1 - momentum) * g + momentum * m instead of m
  int ns_steps = 5;        // Newton-Schulz iterations
  MuonScale scale = MuonScale::Spectral;
};

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::AdamW;
  double lr = 3.0e-4;  // peak learning rate (before schedule and batch scaling)
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1.0e-8;
  double weight_decay = 0.1;  // applied to 2-D weights (embeddings, linear), not to biases or LayerNorm
  MuonConfig muon;            // kind: muon only

  // The matrices' lr at a step whose scheduled lr is `lr`: the schedule's factor
  // (lr / this->lr, warmup, decay and batch scaling included) applied to muon.lr.
  double muon_lr(double lr) const;

  static OptimizerConfig from_yaml(const config::Node& node);
};

}  // namespace geoloco::trainer

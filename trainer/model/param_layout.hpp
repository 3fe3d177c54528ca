// ParamLayout: every parameter of the GPT lives in ONE flat float buffer; this table names
// the views into it. Gradients, AdamW moments, pseudo-gradients, compression and transport
// all operate on spans of buffers with this same layout.
//
// Order is block-major so that a transformer block is one contiguous range (FSDP gathers
// a block at a time; streaming fragments take whole blocks strided over depth):
//
//   wte            (V, C)        transformer.wte.weight
//   wpe            (T, C)        transformer.wpe.weight
//   for each block i in [0, L):                               name prefix transformer.h.{i}.
//     ln_1.weight  (C)          ln_1.bias    (C)
//     attn.c_attn.weight (C, 3C)   attn.c_attn.bias (3C)      -- HF Conv1D layout [in, out]
//     attn.c_proj.weight (C, C)    attn.c_proj.bias (C)
//     ln_2.weight  (C)          ln_2.bias    (C)
//     mlp.c_fc.weight   (C, 4C)    mlp.c_fc.bias   (4C)
//     mlp.c_proj.weight (4C, C)    mlp.c_proj.bias (C)
//   ln_f.weight    (C)           ln_f.bias (C)
//
// Linear weights are stored exactly as Hugging Face's Conv1D stores them, [in, out], so
// y = x @ W + b needs no transpose and checkpoints need no conversion. The LM head is tied
// to wte: logits = x @ wte^T.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "trainer/model/model_config.hpp"

namespace geoloco::trainer {

enum class ParamKind : uint8_t { Embedding, LayerNormWeight, LayerNormBias, LinearWeight, LinearBias };

struct ParamView {
  std::string name;              // Hugging Face GPT-2 name, e.g. "transformer.h.0.attn.c_attn.weight"
  std::vector<int64_t> shape;    // as stored (HF layout)
  int64_t offset = 0;            // in floats, into the flat buffer
  int64_t numel = 0;
  ParamKind kind = ParamKind::LinearWeight;
  int block = -1;                // transformer block index, -1 for wte/wpe/ln_f
  // AdamW weight decay applies to 2-D weights only (not biases, not LayerNorm).
  bool decay() const { return kind == ParamKind::Embedding || kind == ParamKind::LinearWeight; }
};

// Offsets (in floats) of one block's tensors relative to the start of the buffer.
struct BlockOffsets {
  int64_t ln1_w, ln1_b, attn_w, attn_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, fcproj_w, fcproj_b;
  int64_t begin, end;  // the block's whole range [begin, end)
};

class ParamLayout {
 public:
  explicit ParamLayout(const ModelConfig& cfg);

  const ModelConfig& config() const { return cfg_; }
  int64_t total() const { return total_; }
  const std::vector<ParamView>& views() const { return views_; }
  const ParamView& find(const std::string& name) const;  // throws geoloco::Error if absent

  int64_t wte() const { return wte_; }
  int64_t wpe() const { return wpe_; }
  const BlockOffsets& block(int i) const { return blocks_.at(static_cast<size_t>(i)); }
  int64_t lnf_w() const { return lnf_w_; }
  int64_t lnf_b() const { return lnf_b_; }

 private:
  ModelConfig cfg_;
  std::vector<ParamView> views_;
  std::vector<BlockOffsets> blocks_;
  int64_t wte_ = 0, wpe_ = 0, lnf_w_ = 0, lnf_b_ = 0, total_ = 0;
};

}  // namespace geoloco::trainer

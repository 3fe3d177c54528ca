#include "trainer/model/param_layout.hpp"

#include <fmt/format.h>

#include "core/error.hpp"

namespace geoloco::trainer {

ParamLayout::ParamLayout(const ModelConfig& cfg) : cfg_(cfg) {
  const int64_t C = cfg.n_embd, V = cfg.vocab_size, T = cfg.block_size;
  int64_t off = 0;
  auto add = [&](std::string name, std::vector<int64_t> shape, ParamKind kind, int block) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    views_.push_back(ParamView{std::move(name), std::move(shape), off, n, kind, block});
    int64_t at = off;
    off += n;
    return at;
  };
  wte_ = add("transformer.wte.weight", {V, C}, ParamKind::Embedding, -1);
  wpe_ = add("transformer.wpe.weight", {T, C}, ParamKind::Embedding, -1);
  for (int i = 0; i < cfg.n_layer; ++i) {
    std::string p = fmt::format("transformer.h.{}.", i);
    BlockOffsets b{};
    b.begin = off;
    b.ln1_w = add(p + "ln_1.weight", {C}, ParamKind::LayerNormWeight, i);
    b.ln1_b = add(p + "ln_1.bias", {C}, ParamKind::LayerNormBias, i);
    b.attn_w = add(p + "attn.c_attn.weight", {C, 3 * C}, ParamKind::LinearWeight, i);
    b.attn_b = add(p + "attn.c_attn.bias", {3 * C}, ParamKind::LinearBias, i);
    b.proj_w = add(p + "attn.c_proj.weight", {C, C}, ParamKind::LinearWeight, i);
    b.proj_b = add(p + "attn.c_proj.bias", {C}, ParamKind::LinearBias, i);
    b.ln2_w = add(p + "ln_2.weight", {C}, ParamKind::LayerNormWeight, i);
    b.ln2_b = add(p + "ln_2.bias", {C}, ParamKind::LayerNormBias, i);
    b.fc_w = add(p + "mlp.c_fc.weight", {C, 4 * C}, ParamKind::LinearWeight, i);
    b.fc_b = add(p + "mlp.c_fc.bias", {4 * C}, ParamKind::LinearBias, i);
    b.fcproj_w = add(p + "mlp.c_proj.weight", {4 * C, C}, ParamKind::LinearWeight, i);
    b.fcproj_b = add(p + "mlp.c_proj.bias", {C}, ParamKind::LinearBias, i);
    b.end = off;
    blocks_.push_back(b);
  }
  lnf_w_ = add("transformer.ln_f.weight", {C}, ParamKind::LayerNormWeight, -1);
  lnf_b_ = add("transformer.ln_f.bias", {C}, ParamKind::LayerNormBias, -1);
  total_ = off;
}

const ParamView& ParamLayout::find(const std::string& name) const {
  for (const auto& v : views_)
    if (v.name == name) return v;
  throw Error(fmt::format("no parameter named '{}'", name));
}

}  // namespace geoloco::trainer

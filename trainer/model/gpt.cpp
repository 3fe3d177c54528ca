#include "trainer/model/gpt.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.hpp"
#include "core/rng.hpp"
#include "trainer/model/kernels_fast.hpp"
#include "trainer/model/kernels_ref.hpp"

namespace geoloco::trainer {

namespace {

// One table per kernel path, so forward/backward are written once.
struct Ops {
  void (*encoder_forward)(float*, const int32_t*, const float*, const float*, int, int, int);
  void (*encoder_backward)(float*, float*, const float*, const int32_t*, int, int, int);
  void (*layernorm_forward)(float*, float*, float*, const float*, const float*, const float*, int, int);
  void (*layernorm_backward)(float*, float*, float*, const float*, const float*, const float*, const float*,
                             const float*, int, int);
  void (*matmul_forward)(float*, const float*, const float*, const float*, int, int, int);
  void (*matmul_backward)(float*, float*, float*, const float*, const float*, const float*, int, int, int);
  void (*attention_forward)(float*, float*, const float*, int, int, int, int);
  void (*attention_backward)(float*, const float*, const float*, const float*, int, int, int, int);
  void (*gelu_forward)(float*, const float*, int64_t);
  void (*gelu_backward)(float*, const float*, const float*, int64_t);
  void (*residual_forward)(float*, const float*, const float*, int64_t);
  void (*lm_head_forward)(float*, const float*, const float*, int, int, int);
  void (*lm_head_backward)(float*, float*, const float*, const float*, const float*, int, int, int);
  float (*crossentropy_forward)(float*, float*, const float*, const int32_t*, int, int);
  void (*crossentropy_backward)(float*, const float*, const int32_t*, float, int, int);
};

constexpr Ops kFastOps{fast::encoder_forward,    fast::encoder_backward,     fast::layernorm_forward,
                       fast::layernorm_backward, fast::matmul_forward,       fast::matmul_backward,
                       fast::attention_forward,  fast::attention_backward,   fast::gelu_forward,
                       fast::gelu_backward,      fast::residual_forward,     fast::lm_head_forward,
                       fast::lm_head_backward,   fast::crossentropy_forward, fast::crossentropy_backward};

constexpr Ops kRefOps{
    ref::encoder_forward<float>,    ref::encoder_backward<float>,     ref::layernorm_forward<float>,
    ref::layernorm_backward<float>, ref::matmul_forward<float>,       ref::matmul_backward<float>,
    ref::attention_forward<float>,  ref::attention_backward<float>,   ref::gelu_forward<float>,
    ref::gelu_backward<float>,      ref::residual_forward<float>,     ref::lm_head_forward<float>,
    ref::lm_head_backward<float>,   ref::crossentropy_forward<float>, ref::crossentropy_backward<float>};

void grow(std::vector<float>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
}

void zero(std::vector<float>& v, int64_t n) { std::memset(v.data(), 0, sizeof(float) * static_cast<size_t>(n)); }

void check_ids(const int32_t* ids, int64_t n, int T, int V, const char* what) {
  for (int64_t i = 0; i < n; ++i)
    if (ids[i] < 0 || ids[i] >= V) [[unlikely]]
      throw InputError(fmt::format("{} token id {} at position {} (row {}, t {}) is outside [0, {})", what, ids[i], i,
                                   i / T, i % T, V));
}

}  // namespace

Gpt::Gpt(const ModelConfig& cfg, KernelPath path) : cfg_(cfg), layout_(cfg), path_(path) {
  if (cfg.n_layer < 0 || cfg.n_head < 1 || cfg.n_embd < 1 || cfg.n_embd % cfg.n_head != 0 || cfg.block_size < 1 ||
      cfg.vocab_size < 1)
    throw ConfigError(
        fmt::format("model config n_layer {} n_head {} n_embd {} block_size {} vocab_size {}: need "
                    "n_embd a positive multiple of n_head and positive sizes",
                    cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.block_size, cfg.vocab_size));
  layers_.resize(static_cast<size_t>(cfg.n_layer));
}

void Gpt::init_params(const ParamLayout& layout, std::span<float> params, uint64_t seed) {
  GEOLOCO_CHECK(static_cast<int64_t>(params.size()) == layout.total(), "params has {} floats, layout needs {}",
                params.size(), layout.total());
  const int L = layout.config().n_layer;
  const double residual_std = 0.02 / std::sqrt(2.0 * std::max(1, L));
  const auto& views = layout.views();
  for (size_t i = 0; i < views.size(); ++i) {
    const ParamView& v = views[i];
    float* p = params.data() + v.offset;
    switch (v.kind) {
      case ParamKind::LayerNormWeight: std::fill(p, p + v.numel, 1.0f); break;
      case ParamKind::LayerNormBias:
      case ParamKind::LinearBias: std::fill(p, p + v.numel, 0.0f); break;
      case ParamKind::Embedding:
      case ParamKind::LinearWeight: {
        // The two projections that write into the residual stream are scaled down so the
        // stream's variance does not grow with depth (GPT-2 paper, section 2.3).
        bool residual = false;
        if (v.block >= 0) {
          const BlockOffsets& b = layout.block(v.block);
          residual = v.offset == b.proj_w || v.offset == b.fcproj_w;
        }
        const double sd = residual ? residual_std : 0.02;
        Rng rng(mix_seed(seed, i));
        for (int64_t j = 0; j < v.numel; ++j) p[j] = static_cast<float>(sd * rng.normal());
        break;
      }
    }
  }
}

void Gpt::set_num_threads(int n) { fast::set_num_threads(n); }

void Gpt::validate(std::span<const float> params, const int32_t* inputs, const int32_t* targets, int B, int T) const {
  GEOLOCO_CHECK(static_cast<int64_t>(params.size()) == layout_.total(), "params has {} floats, the model needs {}",
                params.size(), layout_.total());
  if (B < 1 || T < 1 || T > cfg_.block_size)
    throw InputError(fmt::format("batch shape B {} T {} is invalid: need B >= 1 and 1 <= T <= block_size {}", B, T,
                                 cfg_.block_size));
  GEOLOCO_CHECK(inputs != nullptr && targets != nullptr, "inputs and targets must not be null");
  const int64_t N = int64_t(B) * T;
  check_ids(inputs, N, T, cfg_.vocab_size, "input");
  check_ids(targets, N, T, cfg_.vocab_size, "target");
}

void Gpt::ensure_buffers(int B, int T) {
  const int64_t N = int64_t(B) * T, C = cfg_.n_embd, NH = cfg_.n_head, V = cfg_.vocab_size;
  grow(encoded_, N * C);
  for (auto& a : layers_) {
    grow(a.ln1, N * C), grow(a.ln1_mean, N), grow(a.ln1_rstd, N);
    grow(a.qkv, N * 3 * C), grow(a.atty, N * C), grow(a.att, N * NH * T);
    grow(a.attproj, N * C), grow(a.res2, N * C);
    grow(a.ln2, N * C), grow(a.ln2_mean, N), grow(a.ln2_rstd, N);
    grow(a.fch, N * 4 * C), grow(a.fch_gelu, N * 4 * C), grow(a.fcproj, N * C), grow(a.res3, N * C);
  }
  grow(lnf_, N * C), grow(lnf_mean_, N), grow(lnf_rstd_, N), grow(probs_, N * V), grow(losses_, N);
  grow(dres_, N * C), grow(dln_, N * C), grow(datty_, N * C), grow(dqkv_, N * 3 * C);
  grow(dfch_gelu_, N * 4 * C), grow(dfch_, N * 4 * C);
}

float Gpt::run_forward(std::span<const float> params, const int32_t* inputs, const int32_t* targets, int B, int T) {
  backward_ready_ = false;
  have_probs_ = false;
  validate(params, inputs, targets, B, T);
  ensure_buffers(B, T);
  const Ops& ops = path_ == KernelPath::Fast ? kFastOps : kRefOps;
  const int N = B * T, C = cfg_.n_embd, NH = cfg_.n_head, V = cfg_.vocab_size;
  const float* P = params.data();
  inputs_.assign(inputs, inputs + N);
  targets_.assign(targets, targets + N);
  B_ = B;
  T_ = T;

  ops.encoder_forward(encoded_.data(), inputs, P + layout_.wte(), P + layout_.wpe(), B, T, C);
  const float* x = encoded_.data();
  for (int l = 0; l < cfg_.n_layer; ++l) {
    const BlockOffsets& o = layout_.block(l);
    LayerActs& a = layers_[l];
    ops.layernorm_forward(a.ln1.data(), a.ln1_mean.data(), a.ln1_rstd.data(), x, P + o.ln1_w, P + o.ln1_b, N, C);
    ops.matmul_forward(a.qkv.data(), a.ln1.data(), P + o.attn_w, P + o.attn_b, N, C, 3 * C);
    ops.attention_forward(a.atty.data(), a.att.data(), a.qkv.data(), B, T, C, NH);
    ops.matmul_forward(a.attproj.data(), a.atty.data(), P + o.proj_w, P + o.proj_b, N, C, C);
    ops.residual_forward(a.res2.data(), x, a.attproj.data(), int64_t(N) * C);
    ops.layernorm_forward(a.ln2.data(), a.ln2_mean.data(), a.ln2_rstd.data(), a.res2.data(), P + o.ln2_w, P + o.ln2_b,
                          N, C);
    ops.matmul_forward(a.fch.data(), a.ln2.data(), P + o.fc_w, P + o.fc_b, N, C, 4 * C);
    ops.gelu_forward(a.fch_gelu.data(), a.fch.data(), int64_t(N) * 4 * C);
    ops.matmul_forward(a.fcproj.data(), a.fch_gelu.data(), P + o.fcproj_w, P + o.fcproj_b, N, 4 * C, C);
    ops.residual_forward(a.res3.data(), a.res2.data(), a.fcproj.data(), int64_t(N) * C);
    x = a.res3.data();
  }
  ops.layernorm_forward(lnf_.data(), lnf_mean_.data(), lnf_rstd_.data(), x, P + layout_.lnf_w(), P + layout_.lnf_b(), N,
                        C);
  ops.lm_head_forward(probs_.data(), lnf_.data(), P + layout_.wte(), N, C, V);
  const float loss = ops.crossentropy_forward(probs_.data(), losses_.data(), probs_.data(), targets, N, V);
  have_probs_ = true;
  forward_params_ = P;
  return loss;
}

float Gpt::forward(std::span<const float> params, const int32_t* inputs, const int32_t* targets, int B, int T) {
  const float loss = run_forward(params, inputs, targets, B, T);
  backward_ready_ = true;
  return loss;
}

float Gpt::evaluate(std::span<const float> params, const int32_t* inputs, const int32_t* targets, int B, int T) {
  return run_forward(params, inputs, targets, B, T);
}

void Gpt::backward(std::span<const float> params, std::span<float> grads, float loss_scale) {
  if (!backward_ready_) throw Error("Gpt::backward needs a forward() first (and one backward per forward)");
  GEOLOCO_CHECK(params.data() == forward_params_ && static_cast<int64_t>(params.size()) == layout_.total(),
                "backward must get the params span the forward used");
  GEOLOCO_CHECK(static_cast<int64_t>(grads.size()) == layout_.total(), "grads has {} floats, the model needs {}",
                grads.size(), layout_.total());
  backward_ready_ = false;
  have_probs_ = false;
  const Ops& ops = path_ == KernelPath::Fast ? kFastOps : kRefOps;
  const int B = B_, T = T_, N = B * T, C = cfg_.n_embd, NH = cfg_.n_head, V = cfg_.vocab_size;
  const float* P = params.data();
  float* G = grads.data();
  const int64_t NC = int64_t(N) * C;

  // The logits' gradient replaces the probabilities in place.
  float* dlogits = probs_.data();
  ops.crossentropy_backward(dlogits, probs_.data(), targets_.data(), loss_scale / float(N), N, V);
  zero(dln_, NC);
  ops.lm_head_backward(dln_.data(), G + layout_.wte(), dlogits, lnf_.data(), P + layout_.wte(), N, C, V);
  const float* x_last = cfg_.n_layer > 0 ? layers_.back().res3.data() : encoded_.data();
  zero(dres_, NC);
  ops.layernorm_backward(dres_.data(), G + layout_.lnf_w(), G + layout_.lnf_b(), dln_.data(), x_last,
                         P + layout_.lnf_w(), lnf_mean_.data(), lnf_rstd_.data(), N, C);

  // dres_ carries the residual stream's gradient down the blocks. A residual add passes
  // its output gradient unchanged to both inputs, so the branch reads dres_ as its output
  // gradient and LayerNorm backward adds the branch's contribution back into dres_.
  for (int l = cfg_.n_layer - 1; l >= 0; --l) {
    const BlockOffsets& o = layout_.block(l);
    LayerActs& a = layers_[l];
    const float* x_in = l > 0 ? layers_[l - 1].res3.data() : encoded_.data();
    zero(dfch_gelu_, 4 * NC);
    ops.matmul_backward(dfch_gelu_.data(), G + o.fcproj_w, G + o.fcproj_b, dres_.data(), a.fch_gelu.data(),
                        P + o.fcproj_w, N, 4 * C, C);
    zero(dfch_, 4 * NC);
    ops.gelu_backward(dfch_.data(), a.fch.data(), dfch_gelu_.data(), 4 * NC);
    zero(dln_, NC);
    ops.matmul_backward(dln_.data(), G + o.fc_w, G + o.fc_b, dfch_.data(), a.ln2.data(), P + o.fc_w, N, C, 4 * C);
    ops.layernorm_backward(dres_.data(), G + o.ln2_w, G + o.ln2_b, dln_.data(), a.res2.data(), P + o.ln2_w,
                           a.ln2_mean.data(), a.ln2_rstd.data(), N, C);
    zero(datty_, NC);
    ops.matmul_backward(datty_.data(), G + o.proj_w, G + o.proj_b, dres_.data(), a.atty.data(), P + o.proj_w, N, C, C);
    zero(dqkv_, 3 * NC);
    ops.attention_backward(dqkv_.data(), datty_.data(), a.qkv.data(), a.att.data(), B, T, C, NH);
    zero(dln_, NC);
    ops.matmul_backward(dln_.data(), G + o.attn_w, G + o.attn_b, dqkv_.data(), a.ln1.data(), P + o.attn_w, N, C, 3 * C);
    ops.layernorm_backward(dres_.data(), G + o.ln1_w, G + o.ln1_b, dln_.data(), x_in, P + o.ln1_w, a.ln1_mean.data(),
                           a.ln1_rstd.data(), N, C);
  }
  ops.encoder_backward(G + layout_.wte(), G + layout_.wpe(), dres_.data(), inputs_.data(), B, T, C);
}

std::span<const float> Gpt::probs() const {
  if (!have_probs_) throw Error("Gpt::probs: no probabilities (no forward yet, or backward consumed them)");
  return {probs_.data(), static_cast<size_t>(int64_t(B_) * T_ * cfg_.vocab_size)};
}

std::span<const float> Gpt::losses() const {
  GEOLOCO_CHECK(B_ > 0, "Gpt::losses before any forward");
  return {losses_.data(), static_cast<size_t>(int64_t(B_) * T_)};
}

}  // namespace geoloco::trainer

#include "trainer/cuda/cuda_gpt.hpp"

#include <cstring>

#include "trainer/cuda/bf16.hpp"
#include "trainer/cuda/handles.hpp"
#include "trainer/cuda/op_profile.hpp"
#include "trainer/cuda/ops.hpp"
#include "trainer/cuda/token_buckets.hpp"

namespace geoloco::cuda {

using trainer::BlockOffsets;

namespace {

void check_ids(const int32_t* ids, int64_t n, int T, int V, const char* what) {
  for (int64_t i = 0; i < n; ++i)
    if (ids[i] < 0 || ids[i] >= V) [[unlikely]]
      throw InputError(fmt::format("{} token id {} at position {} (row {}, t {}) is outside [0, {})", what, ids[i], i,
                                   i / T, i % T, V));
}

}  // namespace

// The precision-independent part; ModelT<A> holds the activations of type A.
struct CudaGpt::Impl {
  Impl(const trainer::ModelConfig& c, Precision p, bool fused_attention)
      : cfg(c), layout(c), precision(p), fused(fused_attention), stream("model compute"), blas(stream.get()) {}
  virtual ~Impl() = default;
  virtual float run_forward(const float* P, int B, int T) = 0;
  virtual void run_backward(const float* P, float* G, float loss_scale, const GradReadyHook& hook) = 0;
  virtual void ensure(int B, int T) = 0;
  virtual std::vector<float> probs_host() const = 0;
  virtual size_t bytes() const = 0;

  float forward(std::span<const float> params, const int32_t* inputs, const int32_t* targets, int B, int T,
                bool for_backward) {
    backward_ready = false;
    have_probs = false;
    GEOLOCO_CHECK(static_cast<int64_t>(params.size()) == layout.total(), "params has {} floats, the model needs {}",
                  params.size(), layout.total());
    if (B < 1 || T < 1 || T > cfg.block_size)
      throw InputError(fmt::format("batch shape B {} T {} is invalid: need B >= 1 and 1 <= T <= block_size {}", B, T,
                                   cfg.block_size));
    GEOLOCO_CHECK(inputs != nullptr && targets != nullptr, "inputs and targets must not be null");
    const int64_t N = int64_t(B) * T;
    check_ids(inputs, N, T, cfg.vocab_size, "input");
    check_ids(targets, N, T, cfg.vocab_size, "target");
    ensure(B, T);
    // The pinned token buffers are free again: the previous forward ended with a stream
    // synchronisation after their upload. A forward for training also uploads the rows
    // grouped by token (the wte gradient's order), right after the targets.
    std::memcpy(tokens_host.data(), inputs, size_t(N) * sizeof(int32_t));
    std::memcpy(tokens_host.data() + N, targets, size_t(N) * sizeof(int32_t));
    int64_t upload = 2 * N;
    if (for_backward) {
      buckets.build(std::span<const int32_t>(inputs, size_t(N)), cfg.vocab_size);
      const auto packed = buckets.packed();
      std::memcpy(tokens_host.data() + 2 * N, packed.data(), packed.size_bytes());
      upload += static_cast<int64_t>(packed.size());
    }
    mark("tokens.upload");
    check_cuda(cudaMemcpyAsync(tokens_dev.data(), tokens_host.data(), size_t(upload) * sizeof(int32_t),
                               cudaMemcpyHostToDevice, stream.get()),
               fmt::format("upload {} token ids", upload));
    Bc = B;
    Tc = T;
    const float loss = run_forward(params.data(), B, T);
    have_probs = true;
    forward_params = params.data();
    backward_ready = for_backward;
    return loss;
  }

  // Inputs [N], targets [N], then the token groups of the inputs (TokenBuckets).
  void grow_tokens(int64_t N) {
    const int64_t need = 2 * N + TokenBuckets::max_packed(N);
    if (static_cast<int64_t>(tokens_dev.size()) >= need) return;
    tokens_dev = DeviceBuffer<int32_t>(size_t(need), "token ids");
    tokens_host = PinnedBuffer<int32_t>(size_t(need), "token ids");
  }
  const int32_t* inputs_dev() const { return tokens_dev.data(); }
  const int32_t* targets_dev() const { return tokens_dev.data() + int64_t(Bc) * Tc; }
  DeviceTokenBuckets buckets_dev() const {
    return {tokens_dev.data() + 2 * int64_t(Bc) * Tc, buckets.rows(), buckets.groups()};
  }

  // With a profile set, the stream's work from here to the next mark is `op`'s.
  void mark(const char* op) const {
    if (profile) profile->mark(op);
  }

  trainer::ModelConfig cfg;
  trainer::ParamLayout layout;
  Precision precision;
  bool fused;  // fused attention: lse per layer instead of the [B, NH, T, T] probabilities
  Stream stream;
  CublasHandle blas;
  DeviceBuffer<char> work;
  DeviceBuffer<int32_t> tokens_dev;
  PinnedBuffer<int32_t> tokens_host;
  TokenBuckets buckets;
  int Bc = 0, Tc = 0;
  const float* forward_params = nullptr;
  bool backward_ready = false, have_probs = false;
  DeviceBuffer<float> losses;
  OpProfile* profile = nullptr;

  OpContext ctx() const { return {stream.get(), blas.get(), const_cast<char*>(work.data()), work.size(), profile}; }
};

namespace {

// The scratch gradients (dln, dfch, ...) are written, not accumulated, by their first op:
// no memset per layer. Only dres, which LayerNorm backward adds into, is zeroed once.
constexpr bool kOverwrite = true;
constexpr bool kPaddedWte = true;  // lm_w holds Vp rows, zero past V

template <class A>
struct ModelT final : CudaGpt::Impl {
  struct Layer {
    A *ln1, *qkv, *atty, *att, *attproj, *res2, *ln2, *fch, *fch_gelu, *fcproj, *res3;
    float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd;
    float* lse;  // fused attention only (att is null then)
  };

  ModelT(const trainer::ModelConfig& c, Precision p, bool fused_attention)
      : Impl(c, p, fused_attention), layers(size_t(c.n_layer)) {
    if constexpr (std::is_same_v<A, bf16>) wcopy = DeviceBuffer<bf16>(size_t(layout.total()), "bf16 weight copy");
    // The LM head's weights padded to Vp rows (zero past V): its GEMMs then run on an aligned
    // width (lm_head_forward in ops.hpp). Rows [0, V) are copied in at each forward.
    lm_w = DeviceBuffer<A>(size_t(Vp()) * size_t(c.n_embd), "LM head weights (padded)");
    check_cuda(cudaMemset(lm_w.data(), 0, lm_w.size() * sizeof(A)), "zero the LM head's padding");
  }

  // Logit row stride: V rounded up to 64 elements (see lm_head_forward in ops.hpp).
  int Vp() const { return (cfg.vocab_size + 63) / 64 * 64; }

  // GEMM weights: the master fp32 buffer itself, or its bf16 copy.
  const A* W(const float* P, int64_t off) const {
    if constexpr (std::is_same_v<A, float>)
      return P + off;
    else
      return wcopy.data() + off;
  }

  void ensure(int B, int T) override {
    if (B == aB && T == aT) return;
    const int64_t N = int64_t(B) * T, C = cfg.n_embd, NH = cfg.n_head, V = cfg.vocab_size;
    const int64_t NC = N * C, L = cfg.n_layer;
    // Activations of type A, then fp32 statistics: one allocation each, carved below.
    const int64_t att_elems = fused ? 0 : int64_t(B) * NH * T * T, lse_elems = fused ? int64_t(B) * NH * T : 0;
    const int64_t per_layer = NC * 18 + att_elems;
    const int64_t acts = NC * 2 /*encoded, lnf*/ + N * Vp() /*probs*/ + L * per_layer + NC * 14 /*backward scratch*/;
    const int64_t stats = N * (4 * L + 2) + L * lse_elems;
    if (acts > static_cast<int64_t>(act.size())) {
      act.reset();
      act = DeviceBuffer<A>(size_t(acts), fmt::format("activations (B {} T {})", B, T));
    }
    if (stats > static_cast<int64_t>(stat.size())) {
      stat.reset();
      stat = DeviceBuffer<float>(size_t(stats), "LayerNorm statistics");
    }
    if (N > static_cast<int64_t>(losses.size())) losses = DeviceBuffer<float>(size_t(N), "losses");
    const size_t wb = workspace_bytes(B, T, int(C), int(NH), int(V), int(sizeof(A)), fused);
    if (wb > work.size()) {
      work.reset();
      work = DeviceBuffer<char>(wb, "op workspace");
    }
    grow_tokens(N);
    A* a = act.data();
    auto take = [&a](int64_t n) {
      A* p = a;
      a += n;
      return p;
    };
    float* s = stat.data();
    auto takef = [&s](int64_t n) {
      float* p = s;
      s += n;
      return p;
    };
    encoded = take(NC);
    lnf = take(NC);
    probs = take(N * Vp());
    for (auto& l : layers) {
      l.ln1 = take(NC), l.qkv = take(3 * NC), l.atty = take(NC), l.att = fused ? nullptr : take(att_elems);
      l.attproj = take(NC), l.res2 = take(NC), l.ln2 = take(NC), l.fch = take(4 * NC), l.fch_gelu = take(4 * NC);
      l.fcproj = take(NC), l.res3 = take(NC);
      l.ln1_mean = takef(N), l.ln1_rstd = takef(N), l.ln2_mean = takef(N), l.ln2_rstd = takef(N);
      l.lse = fused ? takef(lse_elems) : nullptr;
    }
    dres = take(NC), dln = take(NC), datty = take(NC), dqkv = take(3 * NC), dfch_gelu = take(4 * NC);
    dfch = take(4 * NC);
    lnf_mean = takef(N), lnf_rstd = takef(N);
    aB = B;
    aT = T;
  }

  float run_forward(const float* P, int B, int T) override {
    const OpContext c = ctx();
    const int N = B * T, C = cfg.n_embd, NH = cfg.n_head, V = cfg.vocab_size;
    if constexpr (std::is_same_v<A, bf16>) {
      mark("cast_bf16");
      cast_to_bf16(c, wcopy.data(), P, layout.total());
    }
    mark("encoder.fwd");
    encoder_forward<A>(c, encoded, inputs_dev(), P + layout.wte(), P + layout.wpe(), B, T, C);
    const A* x = encoded;
    for (int l = 0; l < cfg.n_layer; ++l) {
      const BlockOffsets& o = layout.block(l);
      Layer& a = layers[size_t(l)];
      mark("layernorm.fwd");
      layernorm_forward<A>(c, a.ln1, a.ln1_mean, a.ln1_rstd, x, P + o.ln1_w, P + o.ln1_b, N, C);
      mark("matmul.qkv.fwd");
      matmul_forward<A>(c, a.qkv, a.ln1, W(P, o.attn_w), P + o.attn_b, N, C, 3 * C);
      mark("attention.fwd");
      attention_fwd(c, a, B, T, C, NH);
      mark("matmul.attproj.fwd");
      matmul_forward<A>(c, a.attproj, a.atty, W(P, o.proj_w), P + o.proj_b, N, C, C);
      mark("residual.fwd");
      residual_forward<A>(c, a.res2, x, a.attproj, int64_t(N) * C);
      mark("layernorm.fwd");
      layernorm_forward<A>(c, a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, P + o.ln2_w, P + o.ln2_b, N, C);
      mark("matmul.fc.fwd");
      matmul_forward<A>(c, a.fch, a.ln2, W(P, o.fc_w), P + o.fc_b, N, C, 4 * C);
      mark("gelu.fwd");
      gelu_forward<A>(c, a.fch_gelu, a.fch, int64_t(N) * 4 * C);
      mark("matmul.fcproj.fwd");
      matmul_forward<A>(c, a.fcproj, a.fch_gelu, W(P, o.fcproj_w), P + o.fcproj_b, N, 4 * C, C);
      mark("residual.fwd");
      residual_forward<A>(c, a.res3, a.res2, a.fcproj, int64_t(N) * C);
      x = a.res3;
    }
    mark("layernorm.fwd");
    layernorm_forward<A>(c, lnf, lnf_mean, lnf_rstd, x, P + layout.lnf_w(), P + layout.lnf_b(), N, C);
    mark("lm_head.fwd");
    check_cuda(cudaMemcpyAsync(lm_w.data(), W(P, layout.wte()), size_t(V) * size_t(C) * sizeof(A),
                               cudaMemcpyDeviceToDevice, stream.get()),
               "copy the LM head's weights");
    lm_head_forward<A>(c, probs, lnf, lm_w.data(), N, C, V, Vp(), kPaddedWte);
    mark("crossentropy.fwd");
    crossentropy_forward<A>(c, probs, losses.data(), probs, targets_dev(), N, V, Vp());
    mark("loss.to_host");
    return mean_loss_to_host(c, losses.data(), N);
  }

  // The layer's attention with the kernel chosen at construction (fused: bf16 only).
  void attention_fwd(const OpContext& c, const Layer& a, int B, int T, int C, int NH) {
    if constexpr (std::is_same_v<A, bf16>)
      if (fused) return attention_forward_fused(c, a.atty, a.lse, a.qkv, B, T, C, NH);
    attention_forward<A>(c, a.atty, a.att, a.qkv, B, T, C, NH);
  }
  void attention_bwd(const OpContext& c, const Layer& a, int B, int T, int C, int NH) {
    if constexpr (std::is_same_v<A, bf16>)
      if (fused) return attention_backward_fused(c, dqkv, datty, a.qkv, a.atty, a.lse, B, T, C, NH, kOverwrite);
    attention_backward<A>(c, dqkv, datty, a.qkv, a.att, B, T, C, NH, kOverwrite);
  }

  void zero(A* p, int64_t n) {
    check_cuda(cudaMemsetAsync(p, 0, size_t(n) * sizeof(A), stream.get()), "zero gradient scratch");
  }

  void run_backward(const float* P, float* G, float loss_scale, const GradReadyHook& hook) override {
    const OpContext c = ctx();
    const int B = Bc, T = Tc, N = B * T, C = cfg.n_embd, NH = cfg.n_head, V = cfg.vocab_size;
    const int64_t NC = int64_t(N) * C;
    A* dlogits = probs;  // the logits' gradient replaces the probabilities in place
    mark("crossentropy.bwd");
    crossentropy_backward<A>(c, dlogits, probs, targets_dev(), loss_scale / float(N), N, V, Vp());
    mark("lm_head.bwd");
    lm_head_backward<A>(c, dln, G + layout.wte(), dlogits, lnf, lm_w.data(), N, C, V, Vp(), kOverwrite, kPaddedWte);
    const A* x_last = cfg.n_layer > 0 ? layers.back().res3 : encoded;
    mark("memset.bwd");
    zero(dres, NC);
    mark("layernorm.bwd");
    layernorm_backward<A>(c, dres, G + layout.lnf_w(), G + layout.lnf_b(), dln, x_last, P + layout.lnf_w(), lnf_mean,
                          lnf_rstd, N, C);
    for (int l = cfg.n_layer - 1; l >= 0; --l) {
      const BlockOffsets& o = layout.block(l);
      Layer& a = layers[size_t(l)];
      const A* x_in = l > 0 ? layers[size_t(l - 1)].res3 : encoded;
      mark("matmul.fcproj.bwd");
      matmul_backward<A>(c, dfch_gelu, G + o.fcproj_w, G + o.fcproj_b, dres, a.fch_gelu, W(P, o.fcproj_w), N, 4 * C, C,
                         kOverwrite);
      mark("gelu.bwd");
      gelu_backward<A>(c, dfch, a.fch, dfch_gelu, 4 * NC, kOverwrite);
      mark("matmul.fc.bwd");
      matmul_backward<A>(c, dln, G + o.fc_w, G + o.fc_b, dfch, a.ln2, W(P, o.fc_w), N, C, 4 * C, kOverwrite);
      mark("layernorm.bwd");
      layernorm_backward<A>(c, dres, G + o.ln2_w, G + o.ln2_b, dln, a.res2, P + o.ln2_w, a.ln2_mean, a.ln2_rstd, N, C);
      mark("matmul.attproj.bwd");
      matmul_backward<A>(c, datty, G + o.proj_w, G + o.proj_b, dres, a.atty, W(P, o.proj_w), N, C, C, kOverwrite);
      mark("attention.bwd");
      attention_bwd(c, a, B, T, C, NH);
      mark("matmul.qkv.bwd");
      matmul_backward<A>(c, dln, G + o.attn_w, G + o.attn_b, dqkv, a.ln1, W(P, o.attn_w), N, C, 3 * C, kOverwrite);
      mark("layernorm.bwd");
      layernorm_backward<A>(c, dres, G + o.ln1_w, G + o.ln1_b, dln, x_in, P + o.ln1_w, a.ln1_mean, a.ln1_rstd, N, C);
      if (hook) {
        mark("grad_hook");
        hook(l, stream.get());
      }
    }
    mark("encoder.bwd");
    encoder_backward<A>(c, G + layout.wte(), G + layout.wpe(), dres, buckets_dev(), B, T, C);
    if (hook) {
      mark("grad_hook");
      hook(-1, stream.get());
    }
  }

  std::vector<float> probs_host() const override {
    const size_t rows = size_t(Bc) * Tc, V = size_t(cfg.vocab_size);
    std::vector<float> out(rows * V);
    check_cuda(cudaStreamSynchronize(stream.get()), "probs_to_host (synchronize)");
    // Drops the row padding: V elements out of every Vp.
    if constexpr (std::is_same_v<A, float>) {
      check_cuda(cudaMemcpy2D(out.data(), V * sizeof(float), probs, size_t(Vp()) * sizeof(float), V * sizeof(float),
                              rows, cudaMemcpyDeviceToHost),
                 "probs_to_host");
    } else {
      std::vector<uint16_t> raw(rows * V);
      check_cuda(cudaMemcpy2D(raw.data(), V * sizeof(uint16_t), probs, size_t(Vp()) * sizeof(uint16_t),
                              V * sizeof(uint16_t), rows, cudaMemcpyDeviceToHost),
                 "probs_to_host");
      bf16_to_floats(raw, out);
    }
    return out;
  }

  size_t bytes() const override {
    return act.size() * sizeof(A) + stat.size() * sizeof(float) + work.size() + wcopy.size() * sizeof(bf16) +
           lm_w.size() * sizeof(A) + losses.size() * sizeof(float) + tokens_dev.size() * sizeof(int32_t);
  }

  std::vector<Layer> layers;
  DeviceBuffer<A> act;
  DeviceBuffer<float> stat;
  DeviceBuffer<bf16> wcopy;
  DeviceBuffer<A> lm_w;
  int aB = 0, aT = 0;
  A *encoded = nullptr, *lnf = nullptr, *probs = nullptr;
  A *dres = nullptr, *dln = nullptr, *datty = nullptr, *dqkv = nullptr, *dfch_gelu = nullptr, *dfch = nullptr;
  float *lnf_mean = nullptr, *lnf_rstd = nullptr;
};

}  // namespace

CudaGpt::CudaGpt(const trainer::ModelConfig& cfg, Precision precision, AttentionKernel attention, int batch) {
  if (cfg.n_layer < 0 || cfg.n_head < 1 || cfg.n_embd < 1 || cfg.n_embd % cfg.n_head != 0 || cfg.block_size < 1 ||
      cfg.vocab_size < 1)
    throw ConfigError(
        fmt::format("model config n_layer {} n_head {} n_embd {} block_size {} vocab_size {}: need "
                    "n_embd a positive multiple of n_head and positive sizes",
                    cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.block_size, cfg.vocab_size));
  int64_t materialized = 0, free_bytes = 0;
  if (attention == AttentionKernel::Auto && batch > 0) {
    size_t f = 0, total = 0;
    check_cuda(cudaMemGetInfo(&f, &total), "cudaMemGetInfo");
    free_bytes = static_cast<int64_t>(f);
    materialized = materialized_attention_bytes(cfg.n_layer, cfg.n_head, batch, cfg.block_size,
                                                precision == Precision::Fp32 ? 4 : 2);
  }
  const bool fused = uses_fused_attention(attention, precision, cfg.n_embd, cfg.n_head, materialized, free_bytes);
  if (precision == Precision::Fp32)
    impl_ = std::make_unique<ModelT<float>>(cfg, precision, false);  // the fused attention is bf16 only
  else
    impl_ = std::make_unique<ModelT<bf16>>(cfg, precision, fused);
}

CudaGpt::~CudaGpt() = default;

const trainer::ModelConfig& CudaGpt::config() const { return impl_->cfg; }
const trainer::ParamLayout& CudaGpt::layout() const { return impl_->layout; }
Precision CudaGpt::precision() const { return impl_->precision; }
bool CudaGpt::fused_attention() const { return impl_->fused; }
cudaStream_t CudaGpt::stream() const { return impl_->stream.get(); }
void CudaGpt::set_profile(OpProfile* profile) { impl_->profile = profile; }

float CudaGpt::forward(std::span<const float> params, const int32_t* inputs, const int32_t* targets, int B, int T) {
  return impl_->forward(params, inputs, targets, B, T, true);
}

float CudaGpt::evaluate(std::span<const float> params, const int32_t* inputs, const int32_t* targets, int B, int T) {
  return impl_->forward(params, inputs, targets, B, T, false);
}

void CudaGpt::backward(std::span<const float> params, std::span<float> grads, float loss_scale,
                       const GradReadyHook& on_grads_ready) {
  if (!impl_->backward_ready) throw Error("CudaGpt::backward needs a forward() first (and one backward per forward)");
  GEOLOCO_CHECK(params.data() == impl_->forward_params && static_cast<int64_t>(params.size()) == impl_->layout.total(),
                "backward must get the params span the forward used");
  GEOLOCO_CHECK(static_cast<int64_t>(grads.size()) == impl_->layout.total(), "grads has {} floats, the model needs {}",
                grads.size(), impl_->layout.total());
  impl_->backward_ready = false;
  impl_->have_probs = false;
  impl_->run_backward(params.data(), grads.data(), loss_scale, on_grads_ready);
}

std::vector<float> CudaGpt::probs_to_host() const {
  if (!impl_->have_probs)
    throw Error("CudaGpt::probs_to_host: no probabilities (no forward yet, or backward consumed them)");
  return impl_->probs_host();
}

std::vector<float> CudaGpt::losses_to_host() const {
  GEOLOCO_CHECK(impl_->Bc > 0, "CudaGpt::losses_to_host before any forward");
  std::vector<float> out(size_t(impl_->Bc) * impl_->Tc);
  check_cuda(cudaStreamSynchronize(impl_->stream.get()), "losses_to_host (synchronize)");
  check_cuda(cudaMemcpy(out.data(), impl_->losses.data(), out.size() * sizeof(float), cudaMemcpyDeviceToHost),
             "losses_to_host");
  return out;
}

size_t CudaGpt::device_bytes() const { return impl_->bytes(); }

}  // namespace geoloco::cuda

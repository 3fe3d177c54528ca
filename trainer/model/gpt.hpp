// Gpt: the GPT-2 forward and backward passes on CPU over an external flat parameter
// buffer laid out by ParamLayout (see param_layout.hpp). The model owns only activations
// and scratch; parameters, gradients and optimizer state belong to the caller, so the
// optimizer, the pseudo-gradient, compression and transport all see plain spans.
//
// Architecture: learned position embedding, pre-LayerNorm blocks (eps 1e-5), causal
// multi-head attention with scale 1/sqrt(head_dim), GELU (tanh approximation), LM head
// tied to wte, mean cross-entropy over all B*T targets.
//
// Not thread-safe: one Gpt per training thread. Kernel threading is process-wide
// (set_num_threads).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "trainer/model/model_config.hpp"
#include "trainer/model/param_layout.hpp"

namespace geoloco::trainer {

// Fast: OpenBLAS GEMMs + OpenMP loops. Reference: the naive single-threaded kernels
// (slow; the oracle for tests and a fallback for debugging).
enum class KernelPath { Fast, Reference };

class Gpt {
 public:
  explicit Gpt(const ModelConfig& cfg, KernelPath path = KernelPath::Fast);

  const ModelConfig& config() const { return cfg_; }
  const ParamLayout& layout() const { return layout_; }
  KernelPath path() const { return path_; }

  // GPT-2 initialisation: N(0, 0.02) for wte, wpe and linear weights, the residual
  // projections (attn.c_proj.weight, mlp.c_proj.weight) scaled by 1/sqrt(2 n_layer),
  // biases 0, LayerNorm weight 1 and bias 0. Each tensor draws from its own stream
  // Rng(mix_seed(seed, tensor index)): the same seed gives the same bits everywhere.
  static void init_params(const ParamLayout& layout, std::span<float> params, uint64_t seed);

  // Runs the model on inputs[B*T] (row-major [B, T]) and returns the mean cross-entropy
  // against targets[B*T]; keeps the activations for backward(). 1 <= T <= block_size.
  // Throws InputError for a token id outside [0, vocab_size) (naming it and its position)
  // or a bad B/T. Activation buffers grow to the largest B*T seen and are then reused.
  float forward(std::span<const float> params, const int32_t* inputs, const int32_t* targets, int B, int T);

  // forward() for evaluation: the same loss, but backward() may not follow it.
  float evaluate(std::span<const float> params, const int32_t* inputs, const int32_t* targets, int B, int T);

  // ACCUMULATES d(loss_scale * loss)/d(params) into grads (+=; the caller zeroes them).
  // Gradient accumulation over k micro-batches: forward/backward k times, loss_scale 1/k.
  // Needs the forward() just before it with the same params span; one backward per forward
  // (it consumes the stored probabilities). Throws geoloco::Error otherwise.
  void backward(std::span<const float> params, std::span<float> grads, float loss_scale = 1.0f);

  // Softmax probabilities [B*T, vocab_size] of the last forward/evaluate; overwritten by
  // backward() (which turns them into the logits' gradient in place).
  std::span<const float> probs() const;
  // Per-position losses [B*T] of the last forward/evaluate.
  std::span<const float> losses() const;

  // Threads for OpenMP loops and OpenBLAS (process-wide). Results are bit-identical run to
  // run for a given thread count; different counts may differ in the last bits.
  static void set_num_threads(int n);

 private:
  struct LayerActs {
    std::vector<float> ln1, ln1_mean, ln1_rstd, qkv, atty, att, attproj, res2;
    std::vector<float> ln2, ln2_mean, ln2_rstd, fch, fch_gelu, fcproj, res3;
  };
  void validate(std::span<const float> params, const int32_t* inputs, const int32_t* targets, int B, int T) const;
  void ensure_buffers(int B, int T);
  float run_forward(std::span<const float> params, const int32_t* inputs, const int32_t* targets, int B, int T);

  ModelConfig cfg_;
  ParamLayout layout_;
  KernelPath path_;

  // What the last forward saw (backward needs them; the caller's arrays may be gone).
  int B_ = 0, T_ = 0;
  std::vector<int32_t> inputs_, targets_;
  const float* forward_params_ = nullptr;
  bool backward_ready_ = false;
  bool have_probs_ = false;

  // Activations, sized for the largest B*T seen.
  std::vector<float> encoded_;
  std::vector<LayerActs> layers_;
  std::vector<float> lnf_, lnf_mean_, lnf_rstd_, probs_, losses_;
  // Backward scratch: the residual stream's gradient and per-op input gradients.
  std::vector<float> dres_, dln_, datty_, dqkv_, dfch_gelu_, dfch_;
};

}  // namespace geoloco::trainer

// CudaGpt: trainer::Gpt's forward and backward on one GPU, with the same API shape and the
// same conventions, over an external flat fp32 parameter buffer in DEVICE memory laid out by
// trainer::ParamLayout. The caller owns parameters, gradients (fp32, device) and optimizer
// state (CudaInnerOptimizer), so collectives (NCCL), the optimizer and pseudo-gradient staging all see
// plain device spans exactly as the CPU path sees host spans.
//
// Precision (train.precision):
//   fp32  every activation in float; the parity baseline against the CPU model.
//   bf16  activations and GEMM operands in bfloat16 (the fp32 master weights are cast into a
//         bf16 copy at the start of each forward), fp32 accumulation, fp32 LayerNorm
//         statistics, fp32 softmax scores, fp32 loss, fp32 parameter gradients.
//
// Streams: all model work runs on stream() (cuBLAS is bound to it). forward()/evaluate()
// return the loss and therefore synchronise that stream; backward() only enqueues. Use the
// block hook to overlap gradient reduction with the rest of the backward pass.
//
// The device must be selected (select_device) before construction; one CudaGpt per thread.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "trainer/cuda/attention_choice.hpp"
#include "trainer/cuda/precision.hpp"
#include "trainer/model/model_config.hpp"
#include "trainer/model/param_layout.hpp"

namespace geoloco::cuda {

class OpProfile;

// Called on the host during backward() once the gradients of transformer block `block` (its
// [begin, end) range of the layout) are final on stream `s`, in the order L-1 ... 0, then
// once with block -1 when wte, wpe and ln_f are final (the whole buffer is then done).
// A reduction may be enqueued on another stream after an event recorded on `s`.
using GradReadyHook = std::function<void(int block, cudaStream_t s)>;

class CudaGpt {
 public:
  // attention: which attention kernel (attention_choice.hpp); Fused where it does not apply
  // is a ConfigError. batch: the sequences per step the model will run (block_size tokens
  // each), for Auto to weigh the materialized attention's memory against the device's free
  // memory now; 0 (unknown): Auto picks fused where it applies.
  CudaGpt(const trainer::ModelConfig& cfg, Precision precision, AttentionKernel attention = AttentionKernel::Auto,
          int batch = 0);
  ~CudaGpt();
  CudaGpt(const CudaGpt&) = delete;
  CudaGpt& operator=(const CudaGpt&) = delete;

  const trainer::ModelConfig& config() const;
  const trainer::ParamLayout& layout() const;
  Precision precision() const;
  bool fused_attention() const;
  cudaStream_t stream() const;

  // inputs/targets: HOST arrays [B*T] (validated like trainer::Gpt: InputError for an id
  // outside [0, vocab) or a bad B/T). params: device span of layout().total() floats.
  float forward(std::span<const float> params, const int32_t* inputs, const int32_t* targets, int B, int T);
  float evaluate(std::span<const float> params, const int32_t* inputs, const int32_t* targets, int B, int T);
  // ACCUMULATES d(loss_scale * loss)/d(params) into grads (device, += ; the caller zeroes
  // them). Needs the forward() just before it with the same params span; throws Error
  // otherwise.
  void backward(std::span<const float> params, std::span<float> grads, float loss_scale = 1.0f,
                const GradReadyHook& on_grads_ready = {});

  // Host copies (synchronous) of the last forward's probabilities [B*T, V] and per-position
  // losses [B*T], as floats.
  std::vector<float> probs_to_host() const;
  std::vector<float> losses_to_host() const;

  // Bytes of device memory this model holds now (activations, scratch, bf16 weight copy).
  size_t device_bytes() const;

  // Marks every op of forward()/evaluate()/backward() in `profile` (op_profile.hpp: names
  // like "matmul.qkv.fwd", "attention.bwd"); nullptr (the default) marks nothing. The
  // profile must outlive its use and be on stream().
  void set_profile(OpProfile* profile);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace geoloco::cuda

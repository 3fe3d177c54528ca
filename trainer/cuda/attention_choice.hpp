// Which attention kernel a CUDA model uses (`train.attention` in the run config).
//   materialized: scores through cuBLAS into a [B, NH, T, T] buffer, a softmax kernel, cuBLAS
//                 again (fp32 and bf16; the parity baseline).
//   fused:        FlashAttention-2 on tensor cores (attention_kernels.hpp): bf16 only, head
//                 size a multiple of 16 and at most kFusedMaxHeadSize; no T x T buffer.
//   auto:         materialized when its T x T buffers fit in half the device's free memory
//                 (on an H200 it ran a GPT-2 124M step 2.5x faster than the fused kernel:
//                 docs/gpu.md), else fused where it applies, else materialized.
// Host logic (tested on CPU).
#pragma once

#include <string>
#include <string_view>

#include "trainer/cuda/precision.hpp"

namespace geoloco::cuda {

constexpr int kFusedMaxHeadSize = 64;

enum class AttentionKernel { Auto, Fused, Materialized };

// "auto" | "fused" | "materialized"; ConfigError naming the value and the choices otherwise.
AttentionKernel parse_attention_kernel(std::string_view s);
const char* attention_kernel_name(AttentionKernel k);

// The head size n_embd / n_head is a multiple of 16 and at most kFusedMaxHeadSize.
bool fused_attention_fits(int n_embd, int n_head);
// Why the fused kernel cannot serve this model ("" when it can).
std::string fused_attention_refusal(Precision p, int n_embd, int n_head);
// Bytes the materialized attention holds for B sequences of T tokens beyond what the fused one
// does: every layer's [B, NH, T, T] probabilities (act_bytes each) and the op workspace's
// scores and their gradient (fp32 + act_bytes).
int64_t materialized_attention_bytes(int n_layer, int n_head, int64_t B, int64_t T, int act_bytes);
// Whether a model uses the fused kernel. Fused throws ConfigError with the refusal when it does
// not apply. Auto: materialized when `materialized_bytes` is known (> 0) and at most half of
// `free_bytes`; else fused when it applies.
bool uses_fused_attention(AttentionKernel k, Precision p, int n_embd, int n_head, int64_t materialized_bytes = 0,
                          int64_t free_bytes = 0);

}  // namespace geoloco::cuda

// Which attention kernel a CUDA model uses (`train.attention` in the run config).
//   materialized: scores through cuBLAS into a [B, NH, T, T] buffer, a softmax kernel, cuBLAS
//                 again (fp32 and bf16; the parity baseline).
//   fused:        FlashAttention-2 on tensor cores (attention_kernels.hpp): bf16 only, head
//                 size a multiple of 16 and at most kFusedMaxHeadSize; no T x T buffer.
//   auto:         fused where it applies, materialized otherwise.
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
// Whether a model uses the fused kernel: Auto picks it when it applies; Fused throws
// ConfigError with the refusal when it does not.
bool uses_fused_attention(AttentionKernel k, Precision p, int n_embd, int n_head);

}  // namespace geoloco::cuda

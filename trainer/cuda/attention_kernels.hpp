// Launchers of the fused causal attention kernels (internal to ops.cpp): FlashAttention-2's
// algorithm on tensor cores (WMMA, bf16 operands, fp32 accumulation), reading q, k, v straight
// from the [B, T, 3C] qkv activations and writing [B, T, C]; the T x T scores never reach
// device memory. The backward is deterministic (no atomics): one kernel accumulates dK and dV
// per key tile, another dQ per query tile, both recomputing the probabilities from the
// forward's log-sum-exp. Head size: a multiple of 16, at most kFusedMaxHeadSize.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "trainer/cuda/attention_choice.hpp"
#include "trainer/cuda/ops.hpp"

namespace geoloco::cuda {

constexpr int kFusedRows = 64;  // query (forward, dQ) or key (dK/dV) rows per block: 4 warps x 16
constexpr int kFusedThreads = 128;

namespace kern {

// out [B, T, C] bf16, lse [B, NH, T] fp32 (log-sum-exp of each row's scaled scores).
void flash_forward(cudaStream_t stream, bf16* out, float* lse, const bf16* qkv, int B, int T, int NH, int hs);
// dsum [B, NH, T] = rowsum(dout * out) per head (FlashAttention-2's D).
void flash_backward_dot(cudaStream_t stream, float* dsum, const bf16* out, const bf16* dout, int B, int T, int NH,
                        int hs);
// dqkv [B, T, 3C]: written (or, with accumulate, added to) for every t < T.
void flash_backward(cudaStream_t stream, bf16* dqkv, const bf16* qkv, const bf16* dout, const float* lse,
                    const float* dsum, int B, int T, int NH, int hs, bool accumulate);

}  // namespace kern
}  // namespace geoloco::cuda

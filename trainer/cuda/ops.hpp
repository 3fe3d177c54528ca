// The CUDA ops of the GPT-2 forward and backward passes: one function per op of
// trainer/model/kernels_ref.hpp, same shapes and the same conventions, so the CPU reference
// is their oracle (tests/trainer/cuda/test_op_parity.cpp):
//   * every *_backward ACCUMULATES into each gradient it produces; crossentropy_backward
//     WRITES dlogits;
//   * activations are row-major [N, X] of the activation type A (float for fp32, __nv_bfloat16
//     for bf16); GEMM weights are in A too (the model casts the fp32 master copy once per
//     forward); LayerNorm weights/biases, linear biases and the embedding tables are read in
//     fp32 from the master copy; every parameter gradient is fp32; internal accumulation is
//     always fp32.
//   * all work is enqueued on ctx.stream (cuBLAS is bound to it); nothing synchronises the
//     host except mean_loss_to_host.
// Determinism: no atomics; every reduction has a fixed order (column sums go through
// fixed-size chunks and a second ordered pass), so the same inputs give the same bits.
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "trainer/cuda/attention_choice.hpp"

namespace geoloco::cuda {

using bf16 = __nv_bfloat16;

// What every op needs: the stream, a cuBLAS handle bound to it, and scratch device memory
// (ops check that it is large enough: workspace_bytes() gives the size for a shape).
class OpProfile;

struct OpContext {
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  void* work = nullptr;
  size_t work_bytes = 0;
  // When set, ops made of several kernels mark their parts (layernorm.bwd.params,
  // matmul.bias.bwd) so a profiled step shows them apart (bench_gpu_gpt2's op profile).
  OpProfile* profile = nullptr;
};

// Scratch bytes the ops need for N = B*T rows, C channels, NH heads, V vocabulary; with
// fused_attention, for the fused attention instead of the materialised one (no T x T scores).
size_t workspace_bytes(int B, int T, int C, int NH, int V, int act_bytes, bool fused_attention = false);

template <class A>
void encoder_forward(const OpContext& ctx, A* out, const int32_t* inp, const float* wte, const float* wpe, int B, int T,
                     int C);
// The batch's rows grouped by token id on the device: TokenBuckets::packed() uploaded
// (token_buckets.hpp), with its row and group counts.
struct DeviceTokenBuckets {
  const int32_t* packed = nullptr;  // [rows N | starts N + 1 | tokens groups]
  int64_t rows = 0, groups = 0;
};
// dwte += the rows of dout summed per token (in row order), dwpe += dout summed over the batch.
template <class A>
void encoder_backward(const OpContext& ctx, float* dwte, float* dwpe, const A* dout, const DeviceTokenBuckets& buckets,
                      int B, int T, int C);

template <class A>
void layernorm_forward(const OpContext& ctx, A* out, float* mean, float* rstd, const A* inp, const float* w,
                       const float* b, int N, int C);
template <class A>
void layernorm_backward(const OpContext& ctx, A* dinp, float* dw, float* db, const A* dout, const A* inp,
                        const float* w, const float* mean, const float* rstd, int N, int C);

// out[N,OC] = inp[N,IC] @ w[IC,OC] + bias; bias (and dbias) may be null.
template <class A>
void matmul_forward(const OpContext& ctx, A* out, const A* inp, const A* w, const float* bias, int N, int IC, int OC);
// Backward ops add into their input gradient (dinp += ...) unless `overwrite` is set, which
// writes it instead and saves the caller zeroing it first. Weight/bias gradients always add.
template <class A>
void matmul_backward(const OpContext& ctx, A* dinp, float* dw, float* dbias, const A* dout, const A* inp, const A* w,
                     int N, int IC, int OC, bool overwrite = false);

// att [B, NH, T, T] (zeros above the diagonal), out [N, C]. Scores and the softmax are fp32.
template <class A>
void attention_forward(const OpContext& ctx, A* out, A* att, const A* qkv, int B, int T, int C, int NH);
template <class A>
void attention_backward(const OpContext& ctx, A* dqkv, const A* dout, const A* qkv, const A* att, int B, int T, int C,
                        int NH, bool overwrite = false);

// Fused causal attention (attention_kernels.hpp: FlashAttention-2 on tensor cores, bf16 only):
// the same result as attention_forward without materialising the scores. lse [B, NH, T]
// (fp32) replaces att as what the backward needs; out is also read by the backward.
// Shapes it serves: fused_attention_fits() (attention_choice.hpp).
void attention_forward_fused(const OpContext& ctx, bf16* out, float* lse, const bf16* qkv, int B, int T, int C, int NH);
void attention_backward_fused(const OpContext& ctx, bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out,
                              const float* lse, int B, int T, int C, int NH, bool overwrite = false);

template <class A>
void gelu_forward(const OpContext& ctx, A* out, const A* inp, int64_t n);
template <class A>
void gelu_backward(const OpContext& ctx, A* dinp, const A* inp, const A* dout, int64_t n, bool overwrite = false);

template <class A>
void residual_forward(const OpContext& ctx, A* out, const A* a, const A* b, int64_t n);
template <class A>
void residual_backward(const OpContext& ctx, A* da, A* db, const A* dout, int64_t n);

// logits[N,V] = inp[N,C] @ wte[V,C]^T (wte in A). Logit rows are ldv >= V apart (-1: V):
// padding the row stride to a multiple of 64 keeps every bf16 row 128-byte aligned, which the
// fast cuBLAS kernels need (GPT-2's V = 50257 is odd); the padding columns are never read.
// padded_wte: wte holds ldv rows, those past V zero. The GEMMs then run on the padded width:
// the forward writes the padding columns (zeros) and the backward's dinp product reads them
// (crossentropy_backward writes them zero). On an H200 the GPT-2 shapes ran 8x (forward) and
// 4x (dinp) faster so than with an odd width (docs/gpu.md).
template <class A>
void lm_head_forward(const OpContext& ctx, A* logits, const A* inp, const A* wte, int N, int C, int V, int ldv = -1,
                     bool padded_wte = false);
template <class A>
void lm_head_backward(const OpContext& ctx, A* dinp, float* dwte, const A* dlogits, const A* inp, const A* wte, int N,
                      int C, int V, int ldv = -1, bool overwrite = false, bool padded_wte = false);

// probs = softmax(logits) (may alias logits), losses[n] fp32 from the logits (log-sum-exp).
template <class A>
void crossentropy_forward(const OpContext& ctx, A* probs, float* losses, const A* logits, const int32_t* targets, int N,
                          int V, int ldv = -1);
// dlogits[n, v] = (probs[n, v] - [v == target]) * dloss, and 0 in the padding columns [V, ldv).
template <class A>
void crossentropy_backward(const OpContext& ctx, A* dlogits, const A* probs, const int32_t* targets, float dloss, int N,
                           int V, int ldv = -1);

// Mean of losses[N] in a fixed summation order; synchronises ctx.stream and returns it.
float mean_loss_to_host(const OpContext& ctx, const float* losses, int N);

// Gradient clipping on the device: the sum of squares of x[n] (fixed-order two-pass
// reduction, fp32 partials, returned as double; synchronises ctx.stream), and x *= s.
double sum_squares_to_host(const OpContext& ctx, const float* x, int64_t n);
void scale_inplace(const OpContext& ctx, float* x, int64_t n, float s);

void cast_to_bf16(const OpContext& ctx, bf16* out, const float* in, int64_t n);
void cast_to_float(const OpContext& ctx, float* out, const bf16* in, int64_t n);

// Row-major GEMM through cuBLAS (column-major underneath: C^T = B^T A^T):
//   C[M,N] = alpha * op(A)[M,K] @ op(B)[K,N] + beta * C, for `batch` matrices at the given
//   element strides. lda/ldb/ldc are the row-major leading dimensions of the stored arrays.
//   Types: A and B the same (fp32 or bf16); C fp32 or the same as A; fp32 accumulation.
enum class DType { F32, BF16 };
void gemm(const OpContext& ctx, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const void* a, int lda,
          int64_t stride_a, const void* b, int ldb, int64_t stride_b, DType ab_type, float beta, void* c, int ldc,
          int64_t stride_c, DType c_type, int batch, const char* what);

}  // namespace geoloco::cuda

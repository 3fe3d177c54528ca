// Launchers of the CUDA kernels behind ops.hpp (internal). The kernels live in
// ops_kernels.cu, which nvcc compiles without any fmt or geoloco::Error header (nvcc's host
// pass and fmt's compile-time format strings do not agree); ops.cpp holds the host logic:
// shapes, workspace carving, cuBLAS calls and error checks after every launch.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "trainer/cuda/ops.hpp"

namespace geoloco::cuda {

constexpr int kThreads = 256;
// Column sums (bias, LayerNorm weight gradients) first sum fixed row chunks, then the
// chunks in order: parallel enough for N = 8192 rows, deterministic, no atomics.
constexpr int kColumnChunks = 64;
constexpr int kColumnTile = 32;  // columns per block of column_partials
constexpr int kColumnLanes = 8;  // row lanes per block of column_partials
// Sum of squares: a fixed grid (not derived from the device) keeps the summation order, and
// so the bits, the same on every GPU model.
constexpr int kSumBlocks = 256;

namespace kern {

template <class A>
void encoder_forward(dim3 grid, dim3 block, cudaStream_t stream, A* out, const int32_t* inp, const float* wte,
                     const float* wpe, int B, int T, int C);
template <class A>
void encoder_backward_wpe(dim3 grid, dim3 block, cudaStream_t stream, float* dwpe, const A* dout, int B, int T, int C);
template <class A>
void encoder_backward_wte(dim3 grid, dim3 block, cudaStream_t stream, float* dwte, const A* dout, const int32_t* rows,
                          const int32_t* starts, const int32_t* tokens, int C);
template <class A>
void layernorm_forward(dim3 grid, dim3 block, cudaStream_t stream, A* out, float* mean, float* rstd, const A* inp,
                       const float* w, const float* b, int N, int C);
template <class A>
void layernorm_backward_dx(dim3 grid, dim3 block, cudaStream_t stream, A* dinp, const A* dout, const A* inp,
                           const float* w, const float* mean, const float* rstd, int N, int C);
template <class A>
void column_partials(dim3 grid, dim3 block, cudaStream_t stream, float* partial_a, float* partial_b, const A* dout,
                     const A* inp, const float* mean, const float* rstd, int N, int C);
void column_finish(dim3 grid, dim3 block, cudaStream_t stream, float* out_a, float* out_b, const float* partial_a,
                   const float* partial_b, int C);
template <class A>
void add_bias(dim3 grid, dim3 block, cudaStream_t stream, A* out, const float* bias, int OC, int64_t N);
template <class A>
void split_heads(dim3 grid, dim3 block, cudaStream_t stream, A* q, A* k, A* v, const A* qkv, int B, int T, int NH,
                 int hs);
template <class A>
void merge_heads(dim3 grid, dim3 block, cudaStream_t stream, A* out, const A* y, int B, int T, int NH, int hs,
                 int64_t out_row, int64_t out_off, bool accumulate);
template <class A>
void split_one(dim3 grid, dim3 block, cudaStream_t stream, A* y, const A* in, int B, int T, int NH, int hs);
template <class A>
void causal_softmax(dim3 grid, dim3 block, cudaStream_t stream, A* att, const float* pre, int64_t rows, int T);
template <class A>
void causal_softmax_backward(dim3 grid, dim3 block, cudaStream_t stream, A* dpre, const A* att, const float* datt,
                             int64_t rows, int T, float scale);
template <class A>
void gelu_forward(dim3 grid, dim3 block, cudaStream_t stream, A* out, const A* inp, int64_t n);
template <class A>
void gelu_backward(dim3 grid, dim3 block, cudaStream_t stream, A* dinp, const A* inp, const A* dout, int64_t n,
                   bool overwrite);
template <class A>
void residual_forward(dim3 grid, dim3 block, cudaStream_t stream, A* out, const A* a, const A* b, int64_t n);
template <class A>
void residual_backward(dim3 grid, dim3 block, cudaStream_t stream, A* da, A* db, const A* dout, int64_t n);
template <class A>
void crossentropy_forward(dim3 grid, dim3 block, cudaStream_t stream, A* probs, float* losses, const A* logits,
                          const int32_t* targets, int V, int ldv);
template <class A>
void crossentropy_backward(dim3 grid, dim3 block, cudaStream_t stream, A* dlogits, const A* probs,
                           const int32_t* targets, float dloss, int V, int ldv, int64_t N);
void mean(dim3 grid, dim3 block, cudaStream_t stream, float* out, const float* x, int N);
void sum_squares_partial(dim3 grid, dim3 block, cudaStream_t stream, float* partial, const float* x, int64_t n);
void sum_partials(dim3 grid, dim3 block, cudaStream_t stream, float* out, const float* partial, int n);
void scale(dim3 grid, dim3 block, cudaStream_t stream, float* x, int64_t n, float s);
void cast_bf16(dim3 grid, dim3 block, cudaStream_t stream, bf16* out, const float* in, int64_t n);
void cast_float(dim3 grid, dim3 block, cudaStream_t stream, float* out, const bf16* in, int64_t n);

}  // namespace kern
}  // namespace geoloco::cuda

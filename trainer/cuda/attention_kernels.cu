// Fused causal attention (see attention_kernels.hpp). Every block has 4 warps; each warp owns
// 16 rows (queries in the forward and dQ kernels, keys in the dK/dV kernel) and walks tiles of
// kTile rows of the other side staged in shared memory. Matrix products go through WMMA
// 16x16x16 fragments, only ever through load/store/mma/fill (the fragment layout is
// unspecified); row-wise work (masking, online softmax, the probability gradients) is done by
// lanes on fp32 tiles the fragments are stored to. Tiles are zero-padded past T, so any T
// works; every shared tile has a 64-element (128-byte) row stride.
#include "trainer/cuda/attention_kernels.hpp"
#include "trainer/cuda/kernel_lang.hpp"

#if defined(__CUDACC__)
#include <mma.h>
#endif

#include <cmath>

namespace geoloco::cuda {

namespace {

using namespace nvcuda;

constexpr int kWarps = kFusedThreads / 32;
constexpr int kTile = 32;                  // rows of the other side per step
constexpr int kHs = kFusedMaxHeadSize;     // shared row stride (elements)

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using FragBt = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;  // a row-major tile, transposed
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

__device__ __forceinline__ float ldf(bf16 x) { return __bfloat162float(x); }

// rows [first, first + n) of one head's [T, hs] slice (row stride `stride`) -> dst [n][kHs],
// zero past T and past hs. Threads tid, tid + nthreads, ... share the work.
__device__ void load_rows(bf16* dst, const bf16* src, int64_t stride, int first, int n, int T, int hs, int tid,
                          int nthreads) {
  const bf16 zero = __float2bfloat16(0.0f);
  for (int e = tid; e < n * kHs; e += nthreads) {
    const int r = e / kHs, d = e - r * kHs, t = first + r;
    dst[e] = (t < T && d < hs) ? src[int64_t(t) * stride + d] : zero;
  }
}

__device__ __forceinline__ void store_out(bf16* p, float v, bool accumulate) {
  *p = __float2bfloat16(accumulate ? ldf(*p) + v : v);
}

// ---- forward -------------------------------------------------------------------------

struct FwdShared {
  alignas(32) bf16 k[kTile][kHs];
  alignas(32) bf16 v[kTile][kHs];
  struct Warp {
    alignas(32) float s[16][kTile];  // scaled, masked scores of the tile
    alignas(32) bf16 p[16][kTile];   // their exponentials (the PV operand)
    alignas(32) float pv[16][16];    // one 16-column slice of P V
    alignas(32) float o[16][kHs];    // the output accumulator; stages the warp's Q rows first
    float m[16], l[16], alpha[16];   // running max, running sum, this tile's rescale factor
  } w[kWarps];
};

// HS: the head size, a compile-time constant so every fragment loop unrolls and the fragment
// arrays stay in registers (with a run-time bound they went to local memory).
template <int HS>
__global__ void __launch_bounds__(kFusedThreads)
    flash_forward_k(bf16* out, float* lse, const bf16* qkv, int T, int NH, float scale) {
  constexpr int hs = HS, nk = HS / 16;
  __shared__ FwdShared sm;
  const int bh = int(blockIdx.y), b = bh / NH, h = bh - b * NH;
  const int q0 = int(blockIdx.x) * kFusedRows, warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int C = NH * hs;
  const int64_t ld3 = 3 * int64_t(C);
  const bf16* q = qkv + int64_t(b) * T * ld3 + int64_t(h) * hs;
  const bf16* k = q + C;
  const bf16* v = q + 2 * C;
  auto& W = sm.w[warp];
  const int qw = q0 + warp * 16;

  bf16* stage = reinterpret_cast<bf16*>(&W.o[0][0]);
  load_rows(stage, q, ld3, qw, 16, T, hs, lane, 32);
  __syncwarp();
  FragA qf[nk];
  GEOLOCO_UNROLL
  for (int kk = 0; kk < nk; ++kk) wmma::load_matrix_sync(qf[kk], stage + kk * 16, kHs);
  __syncwarp();
  for (int e = lane; e < 16 * kHs; e += 32) (&W.o[0][0])[e] = 0.0f;
  if (lane < 16) {
    W.m[lane] = -INFINITY;
    W.l[lane] = 0.0f;
  }
  __syncwarp();

  const int last = min(T, q0 + kFusedRows) - 1;  // keys past the block's last query are masked
  for (int j0 = 0; j0 <= last; j0 += kTile) {
    __syncthreads();  // every warp is done with the previous tile
    load_rows(&sm.k[0][0], k, ld3, j0, kTile, T, hs, int(threadIdx.x), kFusedThreads);
    load_rows(&sm.v[0][0], v, ld3, j0, kTile, T, hs, int(threadIdx.x), kFusedThreads);
    __syncthreads();
    if (qw >= T || j0 > qw + 15) continue;  // warp-uniform: no row of this warp sees the tile
    GEOLOCO_UNROLL
    for (int n = 0; n < kTile / 16; ++n) {  // S = Q K^T
      FragC acc;
      wmma::fill_fragment(acc, 0.0f);
      GEOLOCO_UNROLL
      for (int kk = 0; kk < nk; ++kk) {
        FragBt kb;
        wmma::load_matrix_sync(kb, &sm.k[n * 16][kk * 16], kHs);
        wmma::mma_sync(acc, qf[kk], kb, acc);
      }
      wmma::store_matrix_sync(&W.s[0][n * 16], acc, kTile, wmma::mem_row_major);
    }
    __syncwarp();
    if (lane < 16) {  // online softmax of row i (tile 0 always holds key 0 <= i: the max is finite)
      const int i = qw + lane;
      float mx = W.m[lane];
      for (int c = 0; c < kTile; ++c) {
        const int j = j0 + c;
        const float sc = (j <= i && j < T) ? W.s[lane][c] * scale : -INFINITY;
        W.s[lane][c] = sc;
        mx = fmaxf(mx, sc);
      }
      const float alpha = expf(W.m[lane] - mx);
      float sum = 0.0f;
      for (int c = 0; c < kTile; ++c) {
        const float p = expf(W.s[lane][c] - mx);
        W.p[lane][c] = __float2bfloat16(p);
        sum += p;
      }
      W.l[lane] = W.l[lane] * alpha + sum;
      W.m[lane] = mx;
      W.alpha[lane] = alpha;
    }
    __syncwarp();
    GEOLOCO_UNROLL
    for (int n = 0; n < nk; ++n) {  // O = diag(alpha) O + P V, 16 columns at a time
      FragC acc;
      wmma::fill_fragment(acc, 0.0f);
      GEOLOCO_UNROLL
      for (int kk = 0; kk < kTile / 16; ++kk) {
        FragA pa;
        FragB vb;
        wmma::load_matrix_sync(pa, &W.p[0][kk * 16], kTile);
        wmma::load_matrix_sync(vb, &sm.v[kk * 16][n * 16], kHs);
        wmma::mma_sync(acc, pa, vb, acc);
      }
      wmma::store_matrix_sync(&W.pv[0][0], acc, 16, wmma::mem_row_major);
      __syncwarp();
      for (int e = lane; e < 256; e += 32) {
        const int r = e / 16, c = e % 16;
        W.o[r][n * 16 + c] = W.o[r][n * 16 + c] * W.alpha[r] + W.pv[r][c];
      }
      __syncwarp();
    }
  }
  for (int e = lane; e < 16 * hs; e += 32) {
    const int r = e / hs, d = e - r * hs, i = qw + r;
    if (i < T) out[(int64_t(b) * T + i) * C + int64_t(h) * hs + d] = __float2bfloat16(W.o[r][d] / W.l[r]);
  }
  if (lane < 16 && qw + lane < T) lse[int64_t(bh) * T + qw + lane] = W.m[lane] + logf(W.l[lane]);
}

// ---- backward ------------------------------------------------------------------------

// One thread per (b, h, t) row: D = sum_d dout * out.
__global__ void flash_backward_dot_k(float* dsum, const bf16* out, const bf16* dout, int B, int T, int NH, int hs) {
  const int64_t row = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (row >= int64_t(B) * NH * T) return;
  const int64_t bh = row / T;
  const int t = int(row - bh * T), h = int(bh % NH);
  const int64_t b = bh / NH, at = (b * T + t) * int64_t(NH) * hs + int64_t(h) * hs;
  float s = 0.0f;
  for (int d = 0; d < hs; ++d) s += ldf(dout[at + d]) * ldf(out[at + d]);
  dsum[row] = s;
}

// The two products the backward kernels need for one step, 16 rows x kTile columns each:
// out1 = a1 x1^T and out2 = a2 x2^T, where a1/a2 are the warp's row fragments ([16][16*NK])
// and x1/x2 the step's [kTile][kHs] shared tiles; stored row-major with stride kTile.
template <int NK>
__device__ __forceinline__ void two_products_t(float* out1, float* out2, const FragA* a1, const bf16* x1,
                                               const FragA* a2, const bf16* x2) {
  GEOLOCO_UNROLL
  for (int n = 0; n < kTile / 16; ++n) {
    FragC p1, p2;
    wmma::fill_fragment(p1, 0.0f);
    wmma::fill_fragment(p2, 0.0f);
    GEOLOCO_UNROLL
    for (int kk = 0; kk < NK; ++kk) {
      FragBt b1, b2;
      wmma::load_matrix_sync(b1, x1 + n * 16 * kHs + kk * 16, kHs);
      wmma::mma_sync(p1, a1[kk], b1, p1);
      wmma::load_matrix_sync(b2, x2 + n * 16 * kHs + kk * 16, kHs);
      wmma::mma_sync(p2, a2[kk], b2, p2);
    }
    wmma::store_matrix_sync(out1 + n * 16, p1, kTile, wmma::mem_row_major);
    wmma::store_matrix_sync(out2 + n * 16, p2, kTile, wmma::mem_row_major);
  }
}

struct KvShared {
  alignas(32) bf16 q[kTile][kHs];
  alignas(32) bf16 dout[kTile][kHs];
  float lse[kTile], dsum[kTile];
  struct Warp {
    alignas(32) float st[16][kTile];  // S^T (keys x queries); stages K, V rows and results
    alignas(32) float dpt[16][kTile];  // dP^T = V dO^T
    alignas(32) bf16 pt[16][kTile];
    alignas(32) bf16 dst[16][kTile];
  } w[kWarps];
};

// dK, dV for the block's 64 keys: over every query tile at or after them.
template <int HS>
__global__ void __launch_bounds__(kFusedThreads)
    flash_backward_kv_k(bf16* dqkv, const bf16* qkv, const bf16* dout, const float* lse, const float* dsum, int T,
                        int NH, float scale, bool accumulate) {
  constexpr int hs = HS, nk = HS / 16;
  __shared__ KvShared sm;
  const int bh = int(blockIdx.y), b = bh / NH, h = bh - b * NH;
  const int j0b = int(blockIdx.x) * kFusedRows, warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int tid = int(threadIdx.x);
  const int C = NH * hs;
  const int64_t ld3 = 3 * int64_t(C), head = int64_t(h) * hs;
  const bf16* q = qkv + int64_t(b) * T * ld3 + head;
  const bf16* dO = dout + int64_t(b) * T * C + head;
  bf16* dk = dqkv + int64_t(b) * T * ld3 + head + C;
  bf16* dv = dk + C;
  auto& W = sm.w[warp];
  const int jw = j0b + warp * 16;

  bf16* stage = reinterpret_cast<bf16*>(&W.st[0][0]);
  FragA kf[nk], vf[nk];
  load_rows(stage, q + C, ld3, jw, 16, T, hs, lane, 32);
  __syncwarp();
  GEOLOCO_UNROLL
  for (int kk = 0; kk < nk; ++kk) wmma::load_matrix_sync(kf[kk], stage + kk * 16, kHs);
  __syncwarp();
  load_rows(stage, q + 2 * C, ld3, jw, 16, T, hs, lane, 32);
  __syncwarp();
  GEOLOCO_UNROLL
  for (int kk = 0; kk < nk; ++kk) wmma::load_matrix_sync(vf[kk], stage + kk * 16, kHs);
  FragC dk_acc[nk], dv_acc[nk];
  GEOLOCO_UNROLL
  for (int n = 0; n < nk; ++n) {
    wmma::fill_fragment(dk_acc[n], 0.0f);
    wmma::fill_fragment(dv_acc[n], 0.0f);
  }

  for (int i0 = j0b / kTile * kTile; i0 < T; i0 += kTile) {
    __syncthreads();
    load_rows(&sm.q[0][0], q, ld3, i0, kTile, T, hs, tid, kFusedThreads);
    load_rows(&sm.dout[0][0], dO, C, i0, kTile, T, hs, tid, kFusedThreads);
    for (int e = tid; e < kTile; e += kFusedThreads) {
      const int t = i0 + e;
      sm.lse[e] = t < T ? lse[int64_t(bh) * T + t] : 0.0f;
      sm.dsum[e] = t < T ? dsum[int64_t(bh) * T + t] : 0.0f;
    }
    __syncthreads();
    if (jw >= T || i0 + kTile - 1 < jw) continue;  // warp-uniform: every query precedes these keys
    two_products_t<nk>(&W.st[0][0], &W.dpt[0][0], kf, &sm.q[0][0], vf, &sm.dout[0][0]);  // S^T, dP^T
    __syncwarp();
    for (int e = lane; e < 16 * kTile; e += 32) {
      const int r = e / kTile, c = e - r * kTile, j = jw + r, i = i0 + c;
      const float p = (i >= j && i < T && j < T) ? expf(W.st[r][c] * scale - sm.lse[c]) : 0.0f;
      W.pt[r][c] = __float2bfloat16(p);
      W.dst[r][c] = __float2bfloat16(p * (W.dpt[r][c] - sm.dsum[c]));
    }
    __syncwarp();
    GEOLOCO_UNROLL
    for (int n = 0; n < nk; ++n)
      GEOLOCO_UNROLL
      for (int kk = 0; kk < kTile / 16; ++kk) {
        FragA pa, sa;
        FragB ob, qb;
        wmma::load_matrix_sync(pa, &W.pt[0][kk * 16], kTile);
        wmma::load_matrix_sync(ob, &sm.dout[kk * 16][n * 16], kHs);
        wmma::mma_sync(dv_acc[n], pa, ob, dv_acc[n]);
        wmma::load_matrix_sync(sa, &W.dst[0][kk * 16], kTile);
        wmma::load_matrix_sync(qb, &sm.q[kk * 16][n * 16], kHs);
        wmma::mma_sync(dk_acc[n], sa, qb, dk_acc[n]);
      }
  }
  float* res = &W.st[0][0];
  GEOLOCO_UNROLL
  for (int n = 0; n < nk; ++n)
    GEOLOCO_UNROLL
    for (int which = 0; which < 2; ++which) {
      __syncwarp();
      wmma::store_matrix_sync(res, which == 0 ? dk_acc[n] : dv_acc[n], 16, wmma::mem_row_major);
      __syncwarp();
      for (int e = lane; e < 256; e += 32) {
        const int r = e / 16, c = e % 16, j = jw + r;
        if (j >= T) continue;
        const int64_t at = int64_t(j) * ld3 + n * 16 + c;
        if (which == 0)
          store_out(dk + at, res[e] * scale, accumulate);
        else
          store_out(dv + at, res[e], accumulate);
      }
    }
}

struct QShared {
  alignas(32) bf16 k[kTile][kHs];
  alignas(32) bf16 v[kTile][kHs];
  struct Warp {
    alignas(32) float s[16][kTile];  // S; stages the warp's Q and dO rows and the result
    alignas(32) float dp[16][kTile];
    alignas(32) bf16 ds[16][kTile];
    float lse[16], dsum[16];
  } w[kWarps];
};

// dQ for the block's 64 queries: over every key tile up to them.
template <int HS>
__global__ void __launch_bounds__(kFusedThreads)
    flash_backward_q_k(bf16* dqkv, const bf16* qkv, const bf16* dout, const float* lse, const float* dsum, int T,
                       int NH, float scale, bool accumulate) {
  constexpr int hs = HS, nk = HS / 16;
  __shared__ QShared sm;
  const int bh = int(blockIdx.y), b = bh / NH, h = bh - b * NH;
  const int q0 = int(blockIdx.x) * kFusedRows, warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int C = NH * hs;
  const int64_t ld3 = 3 * int64_t(C), head = int64_t(h) * hs;
  const bf16* q = qkv + int64_t(b) * T * ld3 + head;
  const bf16* k = q + C;
  const bf16* v = q + 2 * C;
  const bf16* dO = dout + int64_t(b) * T * C + head;
  bf16* dq = dqkv + int64_t(b) * T * ld3 + head;
  auto& W = sm.w[warp];
  const int qw = q0 + warp * 16;

  bf16* stage = reinterpret_cast<bf16*>(&W.s[0][0]);
  FragA qf[nk], of[nk];
  load_rows(stage, q, ld3, qw, 16, T, hs, lane, 32);
  __syncwarp();
  GEOLOCO_UNROLL
  for (int kk = 0; kk < nk; ++kk) wmma::load_matrix_sync(qf[kk], stage + kk * 16, kHs);
  __syncwarp();
  load_rows(stage, dO, C, qw, 16, T, hs, lane, 32);
  __syncwarp();
  GEOLOCO_UNROLL
  for (int kk = 0; kk < nk; ++kk) wmma::load_matrix_sync(of[kk], stage + kk * 16, kHs);
  if (lane < 16) {
    const int i = qw + lane;
    W.lse[lane] = i < T ? lse[int64_t(bh) * T + i] : 0.0f;
    W.dsum[lane] = i < T ? dsum[int64_t(bh) * T + i] : 0.0f;
  }
  FragC dq_acc[nk];
  GEOLOCO_UNROLL
  for (int n = 0; n < nk; ++n) wmma::fill_fragment(dq_acc[n], 0.0f);

  const int last = min(T, q0 + kFusedRows) - 1;
  for (int j0 = 0; j0 <= last; j0 += kTile) {
    __syncthreads();
    load_rows(&sm.k[0][0], k, ld3, j0, kTile, T, hs, int(threadIdx.x), kFusedThreads);
    load_rows(&sm.v[0][0], v, ld3, j0, kTile, T, hs, int(threadIdx.x), kFusedThreads);
    __syncthreads();
    if (qw >= T || j0 > qw + 15) continue;
    two_products_t<nk>(&W.s[0][0], &W.dp[0][0], qf, &sm.k[0][0], of, &sm.v[0][0]);  // S, dP
    __syncwarp();
    for (int e = lane; e < 16 * kTile; e += 32) {
      const int r = e / kTile, c = e - r * kTile, i = qw + r, j = j0 + c;
      const float p = (j <= i && j < T && i < T) ? expf(W.s[r][c] * scale - W.lse[r]) : 0.0f;
      W.ds[r][c] = __float2bfloat16(p * (W.dp[r][c] - W.dsum[r]));
    }
    __syncwarp();
    GEOLOCO_UNROLL
    for (int n = 0; n < nk; ++n)
      GEOLOCO_UNROLL
      for (int kk = 0; kk < kTile / 16; ++kk) {
        FragA da;
        FragB kb;
        wmma::load_matrix_sync(da, &W.ds[0][kk * 16], kTile);
        wmma::load_matrix_sync(kb, &sm.k[kk * 16][n * 16], kHs);
        wmma::mma_sync(dq_acc[n], da, kb, dq_acc[n]);
      }
  }
  float* res = &W.s[0][0];
  GEOLOCO_UNROLL
  for (int n = 0; n < nk; ++n) {
    __syncwarp();
    wmma::store_matrix_sync(res, dq_acc[n], 16, wmma::mem_row_major);
    __syncwarp();
    for (int e = lane; e < 256; e += 32) {
      const int r = e / 16, c = e % 16, i = qw + r;
      if (i < T) store_out(dq + int64_t(i) * ld3 + n * 16 + c, res[e] * scale, accumulate);
    }
  }
}

}  // namespace

namespace kern {

namespace {
// Runs f.template operator()<HS>() for the head size (a multiple of 16, at most 64).
template <class F>
void with_head_size(int hs, F&& f) {
  switch (hs) {
    case 16:
      return f.template operator()<16>();
    case 32:
      return f.template operator()<32>();
    case 48:
      return f.template operator()<48>();
    case 64:
      return f.template operator()<64>();
  }
}
}  // namespace

void flash_forward(cudaStream_t stream, bf16* out, float* lse, const bf16* qkv, int B, int T, int NH, int hs) {
  const dim3 grid(unsigned((T + kFusedRows - 1) / kFusedRows), unsigned(B * NH));
  const float scale = 1.0f / sqrtf(float(hs));
  with_head_size(hs, [&]<int HS>() {
    GEOLOCO_LAUNCH(flash_forward_k<HS>, grid, kFusedThreads, 0, stream)(out, lse, qkv, T, NH, scale);
  });
}

void flash_backward_dot(cudaStream_t stream, float* dsum, const bf16* out, const bf16* dout, int B, int T, int NH,
                        int hs) {
  const int64_t rows = int64_t(B) * NH * T;
  GEOLOCO_LAUNCH(flash_backward_dot_k, unsigned((rows + 255) / 256), 256, 0, stream)(dsum, out, dout, B, T, NH, hs);
}

void flash_backward(cudaStream_t stream, bf16* dqkv, const bf16* qkv, const bf16* dout, const float* lse,
                    const float* dsum, int B, int T, int NH, int hs, bool accumulate) {
  const dim3 grid(unsigned((T + kFusedRows - 1) / kFusedRows), unsigned(B * NH));
  const float scale = 1.0f / sqrtf(float(hs));
  with_head_size(hs, [&]<int HS>() {
    GEOLOCO_LAUNCH(flash_backward_kv_k<HS>, grid, kFusedThreads, 0, stream)(dqkv, qkv, dout, lse, dsum, T, NH, scale,
                                                                            accumulate);
    GEOLOCO_LAUNCH(flash_backward_q_k<HS>, grid, kFusedThreads, 0, stream)(dqkv, qkv, dout, lse, dsum, T, NH, scale,
                                                                           accumulate);
  });
}

}  // namespace kern
}  // namespace geoloco::cuda

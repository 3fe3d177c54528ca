// CUDA ops: straightforward kernels (one warp or block per row for the row-wise ops,
// grid-stride loops for elementwise ones) plus cuBLAS for every GEMM. Written to be correct
// and deterministic first; see docs/gpu.md for where the time goes and what to fuse next.
#include "trainer/cuda/ops_kernels.hpp"
#include "trainer/cuda/kernel_lang.hpp"

#include <cmath>

namespace geoloco::cuda {

namespace {

constexpr float kLnEps = 1e-5f;
constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2/pi)

__device__ __forceinline__ float ld(float x) { return x; }
__device__ __forceinline__ float ld(bf16 x) { return __bfloat162float(x); }
template <class A>
__device__ __forceinline__ A st(float x);
template <>
__device__ __forceinline__ float st<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ bf16 st<bf16>(float x) {
  return __float2bfloat16(x);  // round to nearest even, as the host helper in bf16.hpp
}

// Elements c and c + 1 of an array (c even, the array 4-byte aligned): one 4-byte access for
// bf16, so a warp's 32 lanes read or write whole 128-byte lines. Kernels that read back
// activations they write (an accumulating backward) use these: writing bf16 2 bytes a lane (a
// warp covers half a line) and reading the neighbouring half made LayerNorm's backward 15x
// slower than its forward on an H200 (docs/gpu.md).
__device__ __forceinline__ void ld2(const float* p, float& a, float& b) {
  a = p[0];
  b = p[1];
}
__device__ __forceinline__ void ld2(const bf16* p, float& a, float& b) {
  const __nv_bfloat162 v = *reinterpret_cast<const __nv_bfloat162*>(p);
  a = __low2float(v);
  b = __high2float(v);
}
__device__ __forceinline__ void st2(float* p, float a, float b) {
  p[0] = a;
  p[1] = b;
}
__device__ __forceinline__ void st2(bf16* p, float a, float b) {
  __nv_bfloat162 v;
  v.x = __float2bfloat16(a);  // each rounded to nearest even, as st<bf16>
  v.y = __float2bfloat16(b);
  *reinterpret_cast<__nv_bfloat162*>(p) = v;
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Block-wide reductions for blockDim.x a multiple of 32 (<= 1024); every thread gets the result.
__device__ float block_sum(float v, float* sh) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  if (lane == 0) sh[w] = v;
  __syncthreads();
  float r = int(threadIdx.x) < nw ? sh[threadIdx.x] : 0.0f;
  if (w == 0) r = warp_sum(r);
  if (threadIdx.x == 0) sh[32] = r;
  __syncthreads();
  r = sh[32];
  __syncthreads();
  return r;
}
__device__ float block_max(float v, float* sh) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_max(v);
  if (lane == 0) sh[w] = v;
  __syncthreads();
  float r = int(threadIdx.x) < nw ? sh[threadIdx.x] : -INFINITY;
  if (w == 0) r = warp_max(r);
  if (threadIdx.x == 0) sh[32] = r;
  __syncthreads();
  r = sh[32];
  __syncthreads();
  return r;
}

// ---- kernels -------------------------------------------------------------------------

// Row-wise elementwise kernels: x covers the columns (one per thread, fixed for the thread's
// life); rows stride over y (and for [B, T] rows, t over y and b over z), so no thread divides
// an element index (a 64-bit division per element costs more than the element's memory traffic).
#define GEOLOCO_FOR_ROWS(n, N) for (int64_t n = blockIdx.y; n < (N); n += gridDim.y)
#define GEOLOCO_FOR_BT(b, t, B, T)                      \
  for (int64_t b = blockIdx.z; b < (B); b += gridDim.z) \
    for (int64_t t = blockIdx.y; t < (T); t += gridDim.y)

template <class A>
__global__ void encoder_forward_k(A* out, const int32_t* inp, const float* wte, const float* wpe, int B, int T, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  GEOLOCO_FOR_BT(b, t, B, T) {
    const int64_t n = b * T + t;
    out[n * C + c] = st<A>(wte[int64_t(inp[n]) * C + c] + wpe[t * C + c]);
  }
}

// dwpe[t,c] += dout[b,t,c] for b in order (the reference's order, so fp32 is exact).
template <class A>
__global__ void encoder_backward_wpe_k(float* dwpe, const A* dout, int B, int T, int C) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= int64_t(T) * C) return;
  float acc = dwpe[i];
  for (int b = 0; b < B; ++b) acc += ld(dout[int64_t(b) * T * C + i]);
  dwpe[i] = acc;
}

// One block per token group (TokenBuckets): threads stride the channels and add the group's
// rows in ascending row order, the CPU reference's sequential order, so fp32 is bit-exact and
// no atomics are needed. Groups run in parallel; only a very frequent token is long.
template <class A>
__global__ void encoder_backward_wte_k(float* dwte, const A* dout, const int32_t* rows, const int32_t* starts,
                                       const int32_t* tokens, int C) {
  const int64_t g = blockIdx.x;
  const int lo = starts[g], hi = starts[g + 1];
  float* dst = dwte + int64_t(tokens[g]) * C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float acc = dst[c];
    for (int k = lo; k < hi; ++k) acc += ld(dout[int64_t(rows[k]) * C + c]);
    dst[c] = acc;
  }
}

// One warp per row.
template <class A>
__global__ void layernorm_forward_k(A* out, float* mean, float* rstd, const A* inp, const float* w, const float* b,
                                    int N, int C) {
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
  if (row >= N) return;
  const A* x = inp + int64_t(row) * C;
  float s = 0;
  for (int c = lane; c < C; c += 32) s += ld(x[c]);
  const float m = warp_sum(s) / C;
  float v = 0;
  for (int c = lane; c < C; c += 32) {
    const float d = ld(x[c]) - m;
    v += d * d;
  }
  const float r = 1.0f / sqrtf(warp_sum(v) / C + kLnEps);
  A* y = out + int64_t(row) * C;
  for (int c = lane; c < C; c += 32) y[c] = st<A>((ld(x[c]) - m) * r * w[c] + b[c]);
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
}

// One warp per row. With C even (and the rows 4-byte aligned, which C even gives) each lane
// takes pairs of columns (ld2/st2); otherwise single columns.
template <class A>
__global__ void layernorm_backward_dx_k(A* dinp, const A* dout, const A* inp, const float* w, const float* mean,
                                        const float* rstd, int N, int C) {
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
  if (row >= N) return;
  const A* x = inp + int64_t(row) * C;
  const A* dy = dout + int64_t(row) * C;
  A* dx = dinp + int64_t(row) * C;
  const float m = mean[row], r = rstd[row];
  const bool pairs = (C & 1) == 0;
  float gs = 0, gxs = 0;
  if (pairs) {
    for (int c = 2 * lane; c < C; c += 64) {
      float x0, x1, d0, d1;
      ld2(x + c, x0, x1);
      ld2(dy + c, d0, d1);
      const float g0 = d0 * w[c], g1 = d1 * w[c + 1];
      gs += g0 + g1;
      gxs += g0 * (x0 - m) * r + g1 * (x1 - m) * r;
    }
  } else {
    for (int c = lane; c < C; c += 32) {
      const float g = ld(dy[c]) * w[c];
      gs += g;
      gxs += g * (ld(x[c]) - m) * r;
    }
  }
  const float g_mean = warp_sum(gs) / C, gx_mean = warp_sum(gxs) / C;
  if (pairs) {
    for (int c = 2 * lane; c < C; c += 64) {
      float x0, x1, d0, d1, o0, o1;
      ld2(x + c, x0, x1);
      ld2(dy + c, d0, d1);
      ld2(dx + c, o0, o1);
      const float h0 = (x0 - m) * r, h1 = (x1 - m) * r;
      st2(dx + c, o0 + r * (d0 * w[c] - g_mean - h0 * gx_mean), o1 + r * (d1 * w[c + 1] - g_mean - h1 * gx_mean));
    }
  } else {
    for (int c = lane; c < C; c += 32) {
      const float xhat = (ld(x[c]) - m) * r;
      const float g = ld(dy[c]) * w[c];
      dx[c] = st<A>(ld(dx[c]) + r * (g - g_mean - xhat * gx_mean));
    }
  }
}

// partial_w[chunk, c] = sum over the chunk's rows of dout * xhat, partial_b likewise of dout.
// With mean == nullptr it is a plain column sum of dout (bias gradients). A block is
// kColumnTile columns x kColumnLanes row lanes: lane y sums rows y, y + kColumnLanes, ... of
// the chunk, then the lanes' sums are added in lane order through shared memory
// (deterministic). Many row lanes keep enough loads in flight: with one thread per column
// the H200 spent ~1 ms per call here.
template <class A>
__global__ void column_partials_k(float* partial_a, float* partial_b, const A* dout, const A* inp, const float* mean,
                                  const float* rstd, int N, int C) {
  __shared__ float sh_a[kColumnLanes][kColumnTile];
  __shared__ float sh_b[kColumnLanes][kColumnTile];
  const int tx = int(threadIdx.x), ty = int(threadIdx.y);
  const int c = int(blockIdx.x) * kColumnTile + tx;
  const int chunk = int(blockIdx.y), rows = (N + kColumnChunks - 1) / kColumnChunks;
  const int lo = chunk * rows, hi = min(N, lo + rows);
  float sa = 0, sb = 0;
  if (c < C) {
    for (int n = lo + ty; n < hi; n += kColumnLanes) {
      const float dy = ld(dout[int64_t(n) * C + c]);
      if (mean) sa += dy * (ld(inp[int64_t(n) * C + c]) - mean[n]) * rstd[n];
      sb += dy;
    }
  }
  sh_a[ty][tx] = sa;
  sh_b[ty][tx] = sb;
  __syncthreads();
  if (ty != 0 || c >= C) return;
  sa = 0;
  sb = 0;
  for (int y = 0; y < kColumnLanes; ++y) {
    sa += sh_a[y][tx];
    sb += sh_b[y][tx];
  }
  if (partial_a) partial_a[int64_t(chunk) * C + c] = sa;
  partial_b[int64_t(chunk) * C + c] = sb;
}

__global__ void column_finish_k(float* out_a, float* out_b, const float* partial_a, const float* partial_b, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float sa = 0, sb = 0;
  for (int k = 0; k < kColumnChunks; ++k) {
    if (partial_a) sa += partial_a[int64_t(k) * C + c];
    sb += partial_b[int64_t(k) * C + c];
  }
  if (out_a) out_a[c] += sa;
  out_b[c] += sb;
}

// out[n, c] += bias[c]. With OC even a thread owns the column pair (2t, 2t + 1) (ld2/st2: whole
// lines a warp), else column t; the grid covers OC / 2 or OC threads accordingly.
template <class A>
__global__ void add_bias_k(A* out, const float* bias, int OC, int64_t N) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if ((OC & 1) == 0) {
    const int c = 2 * t;
    if (c >= OC) return;
    const float b0 = bias[c], b1 = bias[c + 1];
    GEOLOCO_FOR_ROWS(n, N) {
      float o0, o1;
      ld2(out + n * OC + c, o0, o1);
      st2(out + n * OC + c, o0 + b0, o1 + b1);
    }
    return;
  }
  if (t >= OC) return;
  const float b = bias[t];
  GEOLOCO_FOR_ROWS(n, N) out[n * OC + t] = st<A>(ld(out[n * OC + t]) + b);
}

// Head layout changes between [B, T, (.., NH, hs)] rows and [B, NH, T, hs]. Each thread owns
// one channel c = h * hs + d of a row (h and d derived once).
__device__ __forceinline__ int64_t head_index(int64_t b, int64_t t, int T, int NH, int hs, int h, int d) {
  return ((b * NH + h) * T + t) * hs + d;
}

// qkv [B, T, 3, NH, hs] -> q, k, v [B, NH, T, hs]
template <class A>
__global__ void split_heads_k(A* q, A* k, A* v, const A* qkv, int B, int T, int NH, int hs) {
  const int C = NH * hs;
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int h = c / hs, d = c - h * hs;
  GEOLOCO_FOR_BT(b, t, B, T) {
    const int64_t src = (b * T + t) * 3 * C + c, dst = head_index(b, t, T, NH, hs, h, d);
    q[dst] = qkv[src];
    k[dst] = qkv[src + C];
    v[dst] = qkv[src + 2 * C];
  }
}

// [B, NH, T, hs] -> [B, T, NH*hs] rows of out (row stride out_row, starting at out_off); with
// accumulate, adds into out (gradients).
template <class A>
__global__ void merge_heads_k(A* out, const A* y, int B, int T, int NH, int hs, int64_t out_row, int64_t out_off,
                              bool accumulate) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= NH * hs) return;
  const int h = c / hs, d = c - h * hs;
  GEOLOCO_FOR_BT(b, t, B, T) {
    A* dst = out + (b * T + t) * out_row + out_off + c;
    const A src = y[head_index(b, t, T, NH, hs, h, d)];
    *dst = accumulate ? st<A>(ld(*dst) + ld(src)) : src;
  }
}

// The inverse of merge_heads for a [B, T, C] gradient: dy [B, NH, T, hs].
template <class A>
__global__ void split_one_k(A* y, const A* in, int B, int T, int NH, int hs) {
  const int C = NH * hs;
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int h = c / hs, d = c - h * hs;
  GEOLOCO_FOR_BT(b, t, B, T) y[head_index(b, t, T, NH, hs, h, d)] = in[(b * T + t) * C + c];
}

// One warp per score row (b, h, t): causal softmax of the already scaled fp32 scores.
template <class A>
__global__ void causal_softmax_k(A* att, const float* pre, int64_t rows, int T) {
  const int64_t row = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const int t = int(row % T);
  const float* x = pre + row * T;
  float mx = -INFINITY;
  for (int s = lane; s <= t; s += 32) mx = fmaxf(mx, x[s]);
  mx = warp_max(mx);
  float sum = 0;
  for (int s = lane; s <= t; s += 32) sum += expf(x[s] - mx);
  const float inv = 1.0f / warp_sum(sum);
  A* a = att + row * T;
  for (int s = lane; s < T; s += 32) a[s] = st<A>(s <= t ? expf(x[s] - mx) * inv : 0.0f);
}

// dpre[s] = att[s] * (datt[s] - sum_s' att[s'] datt[s']) * scale, zero above the diagonal.
template <class A>
__global__ void causal_softmax_backward_k(A* dpre, const A* att, const float* datt, int64_t rows, int T, float scale) {
  const int64_t row = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const int t = int(row % T);
  const A* a = att + row * T;
  const float* d = datt + row * T;
  float dot = 0;
  for (int s = lane; s <= t; s += 32) dot += ld(a[s]) * d[s];
  dot = warp_sum(dot);
  A* out = dpre + row * T;
  for (int s = lane; s < T; s += 32) out[s] = st<A>(s <= t ? ld(a[s]) * (d[s] - dot) * scale : 0.0f);
}

template <class A>
__global__ void gelu_forward_k(A* out, const A* inp, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float x = ld(inp[i]);
    out[i] = st<A>(0.5f * x * (1.0f + tanhf(kGeluC * (x + 0.044715f * x * x * x))));
  }
}

template <class A>
__global__ void gelu_backward_k(A* dinp, const A* inp, const A* dout, int64_t n, bool overwrite) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float x = ld(inp[i]);
    const float th = tanhf(kGeluC * (x + 0.044715f * x * x * x));
    const float du = kGeluC * (1.0f + 3.0f * 0.044715f * x * x);
    const float d = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du;
    dinp[i] = st<A>((overwrite ? 0.0f : ld(dinp[i])) + d * ld(dout[i]));
  }
}

template <class A>
__global__ void residual_forward_k(A* out, const A* a, const A* b, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = st<A>(ld(a[i]) + ld(b[i]));
}

template <class A>
__global__ void residual_backward_k(A* da, A* db, const A* dout, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float d = ld(dout[i]);
    da[i] = st<A>(ld(da[i]) + d);
    db[i] = st<A>(ld(db[i]) + d);
  }
}

// One block per row. Each thread keeps an online max and sum of exponentials over its columns
// (one read of the row), the block combines them (fixed order), then writes the
// probabilities. With ldv even (rows 4-byte aligned) columns go in pairs (ld2/st2), so the
// in-place write covers whole lines a warp; an odd last column (odd V) is taken alone.
template <class A>
__global__ void crossentropy_forward_k(A* probs, float* losses, const A* logits, const int32_t* targets, int V,
                                       int ldv) {
  __shared__ float sh[33];
  const int64_t row = blockIdx.x;
  const A* z = logits + row * ldv;
  const int paired = (ldv & 1) == 0 ? (V & ~1) : 0;  // columns [0, paired) in pairs, the rest alone
  float mx = -INFINITY, sum = 0;
  auto take = [&](float v) {
    if (v > mx) {
      sum = sum * expf(mx - v) + 1.0f;
      mx = v;
    } else {
      sum += expf(v - mx);
    }
  };
  for (int v = 2 * int(threadIdx.x); v < paired; v += 2 * int(blockDim.x)) {
    float a, b;
    ld2(z + v, a, b);
    take(a);
    take(b);
  }
  for (int v = paired + int(threadIdx.x); v < V; v += int(blockDim.x)) take(ld(z[v]));
  const float row_max = block_max(mx, sh);
  sum = block_sum(mx == -INFINITY ? 0.0f : sum * expf(mx - row_max), sh);
  mx = row_max;
  if (threadIdx.x == 0) losses[row] = logf(sum) + mx - ld(z[targets[row]]);
  __syncthreads();  // z[target] is read before the row is overwritten in place
  const float inv = 1.0f / sum;
  A* p = probs + row * ldv;
  for (int v = 2 * int(threadIdx.x); v < paired; v += 2 * int(blockDim.x)) {
    float a, b;
    ld2(z + v, a, b);
    st2(p + v, expf(a - mx) * inv, expf(b - mx) * inv);
  }
  for (int v = paired + int(threadIdx.x); v < V; v += int(blockDim.x)) p[v] = st<A>(expf(ld(z[v]) - mx) * inv);
}

// dlogits = (probs - onehot(target)) * dloss, 0 in the padding columns. With ldv even a
// thread owns the column pair (2t, 2t + 1) (the grid covers ldv / 2 columns), else column t.
template <class A>
__global__ void crossentropy_backward_k(A* dlogits, const A* probs, const int32_t* targets, float dloss, int V, int ldv,
                                        int64_t N) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if ((ldv & 1) == 0) {
    const int v = 2 * t;
    if (v >= ldv) return;
    GEOLOCO_FOR_ROWS(n, N) {
      const int64_t at = n * ldv + v;
      const int target = targets[n];
      float p0 = 0, p1 = 0;
      if (v + 1 < V)
        ld2(probs + at, p0, p1);
      else if (v < V)
        p0 = ld(probs[at]);  // V odd: the padding column beside it is not read
      st2(dlogits + at, v < V ? (p0 - (v == target ? 1.0f : 0.0f)) * dloss : 0.0f,
          v + 1 < V ? (p1 - (v + 1 == target ? 1.0f : 0.0f)) * dloss : 0.0f);
    }
    return;
  }
  if (t >= ldv) return;
  GEOLOCO_FOR_ROWS(n, N) {
    const int64_t at = n * ldv + t;
    dlogits[at] = t < V ? st<A>((ld(probs[at]) - (t == targets[n] ? 1.0f : 0.0f)) * dloss) : st<A>(0.0f);
  }
}

__global__ void mean_k(float* out, const float* x, int N) {
  __shared__ float sh[33];
  float s = 0;
  for (int i = threadIdx.x; i < N; i += blockDim.x) s += x[i];
  s = block_sum(s, sh);
  if (threadIdx.x == 0) *out = s / N;
}

__global__ void sum_squares_partial_k(float* partial, const float* x, int64_t n) {
  __shared__ float sh[33];
  float s = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    s += x[i] * x[i];
  s = block_sum(s, sh);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}
__global__ void sum_partials_k(float* out, const float* partial, int n) {
  __shared__ float sh[33];
  float s = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) s += partial[i];
  s = block_sum(s, sh);
  if (threadIdx.x == 0) *out = s;
}
__global__ void scale_k(float* x, int64_t n, float s) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] *= s;
}

__global__ void cast_bf16_k(bf16* out, const float* in, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16(in[i]);
}
__global__ void cast_float_k(float* out, const bf16* in, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = __bfloat162float(in[i]);
}

}  // namespace

namespace kern {

template <class A>
void encoder_forward(dim3 grid, dim3 block, cudaStream_t stream, A* out, const int32_t* inp, const float* wte,
                     const float* wpe, int B, int T, int C) {
  GEOLOCO_LAUNCH(encoder_forward_k<A>, grid, block, 0, stream)(out, inp, wte, wpe, B, T, C);
}
template void encoder_forward<float>(dim3, dim3, cudaStream_t, float*, const int32_t*, const float*, const float*, int,
                                     int, int);
template void encoder_forward<bf16>(dim3, dim3, cudaStream_t, bf16*, const int32_t*, const float*, const float*, int,
                                    int, int);

template <class A>
void encoder_backward_wpe(dim3 grid, dim3 block, cudaStream_t stream, float* dwpe, const A* dout, int B, int T, int C) {
  GEOLOCO_LAUNCH(encoder_backward_wpe_k<A>, grid, block, 0, stream)(dwpe, dout, B, T, C);
}
template void encoder_backward_wpe<float>(dim3, dim3, cudaStream_t, float*, const float*, int, int, int);
template void encoder_backward_wpe<bf16>(dim3, dim3, cudaStream_t, float*, const bf16*, int, int, int);

template <class A>
void encoder_backward_wte(dim3 grid, dim3 block, cudaStream_t stream, float* dwte, const A* dout, const int32_t* rows,
                          const int32_t* starts, const int32_t* tokens, int C) {
  GEOLOCO_LAUNCH(encoder_backward_wte_k<A>, grid, block, 0, stream)(dwte, dout, rows, starts, tokens, C);
}
template void encoder_backward_wte<float>(dim3, dim3, cudaStream_t, float*, const float*, const int32_t*,
                                          const int32_t*, const int32_t*, int);
template void encoder_backward_wte<bf16>(dim3, dim3, cudaStream_t, float*, const bf16*, const int32_t*, const int32_t*,
                                         const int32_t*, int);

template <class A>
void layernorm_forward(dim3 grid, dim3 block, cudaStream_t stream, A* out, float* mean, float* rstd, const A* inp,
                       const float* w, const float* b, int N, int C) {
  GEOLOCO_LAUNCH(layernorm_forward_k<A>, grid, block, 0, stream)(out, mean, rstd, inp, w, b, N, C);
}
template void layernorm_forward<float>(dim3, dim3, cudaStream_t, float*, float*, float*, const float*, const float*,
                                       const float*, int, int);
template void layernorm_forward<bf16>(dim3, dim3, cudaStream_t, bf16*, float*, float*, const bf16*, const float*,
                                      const float*, int, int);

template <class A>
void layernorm_backward_dx(dim3 grid, dim3 block, cudaStream_t stream, A* dinp, const A* dout, const A* inp,
                           const float* w, const float* mean, const float* rstd, int N, int C) {
  GEOLOCO_LAUNCH(layernorm_backward_dx_k<A>, grid, block, 0, stream)(dinp, dout, inp, w, mean, rstd, N, C);
}
template void layernorm_backward_dx<float>(dim3, dim3, cudaStream_t, float*, const float*, const float*, const float*,
                                           const float*, const float*, int, int);
template void layernorm_backward_dx<bf16>(dim3, dim3, cudaStream_t, bf16*, const bf16*, const bf16*, const float*,
                                          const float*, const float*, int, int);

template <class A>
void column_partials(dim3 grid, dim3 block, cudaStream_t stream, float* partial_a, float* partial_b, const A* dout,
                     const A* inp, const float* mean, const float* rstd, int N, int C) {
  GEOLOCO_LAUNCH(column_partials_k<A>, grid, block, 0, stream)(partial_a, partial_b, dout, inp, mean, rstd, N, C);
}
template void column_partials<float>(dim3, dim3, cudaStream_t, float*, float*, const float*, const float*, const float*,
                                     const float*, int, int);
template void column_partials<bf16>(dim3, dim3, cudaStream_t, float*, float*, const bf16*, const bf16*, const float*,
                                    const float*, int, int);

void column_finish(dim3 grid, dim3 block, cudaStream_t stream, float* out_a, float* out_b, const float* partial_a,
                   const float* partial_b, int C) {
  GEOLOCO_LAUNCH(column_finish_k, grid, block, 0, stream)(out_a, out_b, partial_a, partial_b, C);
}

template <class A>
void add_bias(dim3 grid, dim3 block, cudaStream_t stream, A* out, const float* bias, int OC, int64_t N) {
  GEOLOCO_LAUNCH(add_bias_k<A>, grid, block, 0, stream)(out, bias, OC, N);
}
template void add_bias<float>(dim3, dim3, cudaStream_t, float*, const float*, int, int64_t);
template void add_bias<bf16>(dim3, dim3, cudaStream_t, bf16*, const float*, int, int64_t);

template <class A>
void split_heads(dim3 grid, dim3 block, cudaStream_t stream, A* q, A* k, A* v, const A* qkv, int B, int T, int NH,
                 int hs) {
  GEOLOCO_LAUNCH(split_heads_k<A>, grid, block, 0, stream)(q, k, v, qkv, B, T, NH, hs);
}
template void split_heads<float>(dim3, dim3, cudaStream_t, float*, float*, float*, const float*, int, int, int, int);
template void split_heads<bf16>(dim3, dim3, cudaStream_t, bf16*, bf16*, bf16*, const bf16*, int, int, int, int);

template <class A>
void merge_heads(dim3 grid, dim3 block, cudaStream_t stream, A* out, const A* y, int B, int T, int NH, int hs,
                 int64_t out_row, int64_t out_off, bool accumulate) {
  GEOLOCO_LAUNCH(merge_heads_k<A>, grid, block, 0, stream)(out, y, B, T, NH, hs, out_row, out_off, accumulate);
}
template void merge_heads<float>(dim3, dim3, cudaStream_t, float*, const float*, int, int, int, int, int64_t, int64_t,
                                 bool);
template void merge_heads<bf16>(dim3, dim3, cudaStream_t, bf16*, const bf16*, int, int, int, int, int64_t, int64_t,
                                bool);

template <class A>
void split_one(dim3 grid, dim3 block, cudaStream_t stream, A* y, const A* in, int B, int T, int NH, int hs) {
  GEOLOCO_LAUNCH(split_one_k<A>, grid, block, 0, stream)(y, in, B, T, NH, hs);
}
template void split_one<float>(dim3, dim3, cudaStream_t, float*, const float*, int, int, int, int);
template void split_one<bf16>(dim3, dim3, cudaStream_t, bf16*, const bf16*, int, int, int, int);

template <class A>
void causal_softmax(dim3 grid, dim3 block, cudaStream_t stream, A* att, const float* pre, int64_t rows, int T) {
  GEOLOCO_LAUNCH(causal_softmax_k<A>, grid, block, 0, stream)(att, pre, rows, T);
}
template void causal_softmax<float>(dim3, dim3, cudaStream_t, float*, const float*, int64_t, int);
template void causal_softmax<bf16>(dim3, dim3, cudaStream_t, bf16*, const float*, int64_t, int);

template <class A>
void causal_softmax_backward(dim3 grid, dim3 block, cudaStream_t stream, A* dpre, const A* att, const float* datt,
                             int64_t rows, int T, float scale) {
  GEOLOCO_LAUNCH(causal_softmax_backward_k<A>, grid, block, 0, stream)(dpre, att, datt, rows, T, scale);
}
template void causal_softmax_backward<float>(dim3, dim3, cudaStream_t, float*, const float*, const float*, int64_t, int,
                                             float);
template void causal_softmax_backward<bf16>(dim3, dim3, cudaStream_t, bf16*, const bf16*, const float*, int64_t, int,
                                            float);

template <class A>
void gelu_forward(dim3 grid, dim3 block, cudaStream_t stream, A* out, const A* inp, int64_t n) {
  GEOLOCO_LAUNCH(gelu_forward_k<A>, grid, block, 0, stream)(out, inp, n);
}
template void gelu_forward<float>(dim3, dim3, cudaStream_t, float*, const float*, int64_t);
template void gelu_forward<bf16>(dim3, dim3, cudaStream_t, bf16*, const bf16*, int64_t);

template <class A>
void gelu_backward(dim3 grid, dim3 block, cudaStream_t stream, A* dinp, const A* inp, const A* dout, int64_t n,
                   bool overwrite) {
  GEOLOCO_LAUNCH(gelu_backward_k<A>, grid, block, 0, stream)(dinp, inp, dout, n, overwrite);
}
template void gelu_backward<float>(dim3, dim3, cudaStream_t, float*, const float*, const float*, int64_t, bool);
template void gelu_backward<bf16>(dim3, dim3, cudaStream_t, bf16*, const bf16*, const bf16*, int64_t, bool);

template <class A>
void residual_forward(dim3 grid, dim3 block, cudaStream_t stream, A* out, const A* a, const A* b, int64_t n) {
  GEOLOCO_LAUNCH(residual_forward_k<A>, grid, block, 0, stream)(out, a, b, n);
}
template void residual_forward<float>(dim3, dim3, cudaStream_t, float*, const float*, const float*, int64_t);
template void residual_forward<bf16>(dim3, dim3, cudaStream_t, bf16*, const bf16*, const bf16*, int64_t);

template <class A>
void residual_backward(dim3 grid, dim3 block, cudaStream_t stream, A* da, A* db, const A* dout, int64_t n) {
  GEOLOCO_LAUNCH(residual_backward_k<A>, grid, block, 0, stream)(da, db, dout, n);
}
template void residual_backward<float>(dim3, dim3, cudaStream_t, float*, float*, const float*, int64_t);
template void residual_backward<bf16>(dim3, dim3, cudaStream_t, bf16*, bf16*, const bf16*, int64_t);

template <class A>
void crossentropy_forward(dim3 grid, dim3 block, cudaStream_t stream, A* probs, float* losses, const A* logits,
                          const int32_t* targets, int V, int ldv) {
  GEOLOCO_LAUNCH(crossentropy_forward_k<A>, grid, block, 0, stream)(probs, losses, logits, targets, V, ldv);
}
template void crossentropy_forward<float>(dim3, dim3, cudaStream_t, float*, float*, const float*, const int32_t*, int,
                                          int);
template void crossentropy_forward<bf16>(dim3, dim3, cudaStream_t, bf16*, float*, const bf16*, const int32_t*, int,
                                         int);

template <class A>
void crossentropy_backward(dim3 grid, dim3 block, cudaStream_t stream, A* dlogits, const A* probs,
                           const int32_t* targets, float dloss, int V, int ldv, int64_t N) {
  GEOLOCO_LAUNCH(crossentropy_backward_k<A>, grid, block, 0, stream)(dlogits, probs, targets, dloss, V, ldv, N);
}
template void crossentropy_backward<float>(dim3, dim3, cudaStream_t, float*, const float*, const int32_t*, float, int,
                                           int, int64_t);
template void crossentropy_backward<bf16>(dim3, dim3, cudaStream_t, bf16*, const bf16*, const int32_t*, float, int, int,
                                          int64_t);

void mean(dim3 grid, dim3 block, cudaStream_t stream, float* out, const float* x, int N) {
  GEOLOCO_LAUNCH(mean_k, grid, block, 0, stream)(out, x, N);
}

void sum_squares_partial(dim3 grid, dim3 block, cudaStream_t stream, float* partial, const float* x, int64_t n) {
  GEOLOCO_LAUNCH(sum_squares_partial_k, grid, block, 0, stream)(partial, x, n);
}

void sum_partials(dim3 grid, dim3 block, cudaStream_t stream, float* out, const float* partial, int n) {
  GEOLOCO_LAUNCH(sum_partials_k, grid, block, 0, stream)(out, partial, n);
}

void scale(dim3 grid, dim3 block, cudaStream_t stream, float* x, int64_t n, float s) {
  GEOLOCO_LAUNCH(scale_k, grid, block, 0, stream)(x, n, s);
}

void cast_bf16(dim3 grid, dim3 block, cudaStream_t stream, bf16* out, const float* in, int64_t n) {
  GEOLOCO_LAUNCH(cast_bf16_k, grid, block, 0, stream)(out, in, n);
}

void cast_float(dim3 grid, dim3 block, cudaStream_t stream, float* out, const bf16* in, int64_t n) {
  GEOLOCO_LAUNCH(cast_float_k, grid, block, 0, stream)(out, in, n);
}

}  // namespace kern
}  // namespace geoloco::cuda

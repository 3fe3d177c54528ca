#include "trainer/model/kernels_fast.hpp"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "trainer/model/fast_math.hpp"

namespace geoloco::trainer::fast {

namespace {

constexpr float kLnEps = 1e-5f;
constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2/pi)
// Attention works on row blocks of this many queries so the causal upper triangle is
// mostly skipped (block b only needs keys [0, end of b)); 64 keeps each GEMM big enough
// for OpenBLAS to run near its peak.
constexpr int kAttBlock = 64;

// The [begin, end) slice of n items owned by thread tid of nth: a fixed partition, so
// which thread sums what depends only on the thread count.
inline void thread_range(int64_t n, int tid, int nth, int64_t& begin, int64_t& end) {
  begin = n * tid / nth;
  end = n * (tid + 1) / nth;
}

// dst[w] += sum_n src[n, w]: threads own column ranges and each column sums rows in order.
void colsum_accumulate(float* dst, const float* src, int N, int W) {
#pragma omp parallel
  {
    int64_t c0, c1;
    thread_range(W, omp_get_thread_num(), omp_get_num_threads(), c0, c1);
    for (int n = 0; n < N; ++n) {
      const float* row = src + int64_t(n) * W;
#pragma omp simd
      for (int64_t c = c0; c < c1; ++c) dst[c] += row[c];
    }
  }
}

// Per-thread scratch that survives across calls (OpenMP keeps its worker threads).
std::vector<float>& scratch(size_t n) {
  thread_local std::vector<float> buf;
  if (buf.size() < n) buf.resize(n);
  return buf;
}

// While OpenMP threads each call cblas_sgemm on their own (b, h) slices, OpenBLAS must not
// also fan out to its own pthread pool: that oversubscribes the cores and serializes on the
// pool. Single-threaded BLAS for the scope, restored after.
class SerialBlasScope {
 public:
  SerialBlasScope() : saved_(openblas_get_num_threads()) {
    if (saved_ > 1 && omp_get_max_threads() > 1) openblas_set_num_threads(1);
  }
  ~SerialBlasScope() {
    if (openblas_get_num_threads() != saved_) openblas_set_num_threads(saved_);
  }
  SerialBlasScope(const SerialBlasScope&) = delete;
  SerialBlasScope& operator=(const SerialBlasScope&) = delete;

 private:
  int saved_;
};

}  // namespace

void set_num_threads(int n) {
  n = std::max(1, n);
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

int num_threads() { return omp_get_max_threads(); }

void encoder_forward(float* out, const int32_t* inp, const float* wte, const float* wpe, int B, int T, int C) {
  const int64_t N = int64_t(B) * T;
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* e = wte + int64_t(inp[n]) * C;
    const float* p = wpe + (n % T) * C;
    float* o = out + n * C;
#pragma omp simd
    for (int c = 0; c < C; ++c) o[c] = e[c] + p[c];
  }
}

void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* inp, int B, int T, int C) {
  // Rows scatter into arbitrary wte rows, so threads split the channels instead of rows:
  // no two threads ever touch the same float.
  const int64_t N = int64_t(B) * T;
#pragma omp parallel
  {
    int64_t c0, c1;
    thread_range(C, omp_get_thread_num(), omp_get_num_threads(), c0, c1);
    for (int64_t n = 0; n < N; ++n) {
      const float* d = dout + n * C;
      float* de = dwte + int64_t(inp[n]) * C;
      float* dp = dwpe + (n % T) * C;
#pragma omp simd
      for (int64_t c = c0; c < c1; ++c) {
        de[c] += d[c];
        dp[c] += d[c];
      }
    }
  }
}

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b,
                       int N, int C) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* x = inp + int64_t(n) * C;
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int c = 0; c < C; ++c) s += x[c];
    const float m = s / C;
    float v = 0;
#pragma omp simd reduction(+ : v)
    for (int c = 0; c < C; ++c) v += (x[c] - m) * (x[c] - m);
    const float r = 1.0f / std::sqrt(v / C + kLnEps);
    float* o = out + int64_t(n) * C;
#pragma omp simd
    for (int c = 0; c < C; ++c) o[c] = (x[c] - m) * r * w[c] + b[c];
    mean[n] = m;
    rstd[n] = r;
  }
}

void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                        const float* mean, const float* rstd, int N, int C) {
  const int nt = omp_get_max_threads();
  // dw/db are sums over rows: each thread sums its fixed row range into its own partial,
  // and the partials are added in thread order afterwards (deterministic, no atomics).
  std::vector<float> partial(size_t(nt) * 2 * C, 0.0f);
  int used = 1;
#pragma omp parallel num_threads(nt)
  {
    const int tid = omp_get_thread_num(), nth = omp_get_num_threads();
#pragma omp single
    used = nth;
    float* pdw = partial.data() + size_t(tid) * 2 * C;
    float* pdb = pdw + C;
    int64_t r0, r1;
    thread_range(N, tid, nth, r0, r1);
    for (int64_t n = r0; n < r1; ++n) {
      const float* x = inp + n * C;
      const float* dy = dout + n * C;
      float* dx = dinp + n * C;
      const float m = mean[n], r = rstd[n];
      float g_sum = 0, gx_sum = 0;
#pragma omp simd reduction(+ : g_sum, gx_sum)
      for (int c = 0; c < C; ++c) {
        const float g = dy[c] * w[c];
        g_sum += g;
        gx_sum += g * ((x[c] - m) * r);
      }
      const float g_mean = g_sum / C, gx_mean = gx_sum / C;
#pragma omp simd
      for (int c = 0; c < C; ++c) {
        const float xhat = (x[c] - m) * r;
        dx[c] += r * (dy[c] * w[c] - g_mean - xhat * gx_mean);
        pdw[c] += dy[c] * xhat;
        pdb[c] += dy[c];
      }
    }
  }
  for (int t = 0; t < used; ++t) {
    const float* pdw = partial.data() + size_t(t) * 2 * C;
    const float* pdb = pdw + C;
#pragma omp simd
    for (int c = 0; c < C; ++c) {
      dw[c] += pdw[c];
      db[c] += pdb[c];
    }
  }
}

void matmul_forward(float* out, const float* inp, const float* w, const float* bias, int N, int IC, int OC) {
  float beta = 0.0f;
  if (bias) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; ++n) std::memcpy(out + int64_t(n) * OC, bias, sizeof(float) * size_t(OC));
    beta = 1.0f;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, OC, IC, 1.0f, inp, IC, w, OC, beta, out, OC);
}

void matmul_backward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp, const float* w,
                     int N, int IC, int OC) {
  // dinp[N,IC] += dout[N,OC] @ w[IC,OC]^T
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, IC, OC, 1.0f, dout, OC, w, OC, 1.0f, dinp, IC);
  // dw[IC,OC] += inp[N,IC]^T @ dout[N,OC]
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, IC, OC, N, 1.0f, inp, IC, dout, OC, 1.0f, dw, OC);
  if (dbias) colsum_accumulate(dbias, dout, N, OC);
}

void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(float(hs));
  const int C3 = 3 * C;
  SerialBlasScope serial_blas;
#pragma omp parallel for schedule(static) collapse(2)
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h) {
      const float* q = qkv + int64_t(b) * T * C3 + h * hs;
      const float* k = q + C;
      const float* v = q + 2 * C;
      float* a = att + (int64_t(b) * NH + h) * T * T;
      float* y = out + int64_t(b) * T * C + h * hs;
      for (int r0 = 0; r0 < T; r0 += kAttBlock) {
        const int r1 = std::min(T, r0 + kAttBlock);
        // scores for queries [r0, r1) against keys [0, r1): the rest is masked anyway.
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r1 - r0, r1, hs, scale, q + int64_t(r0) * C3, C3,
                    k, C3, 0.0f, a + int64_t(r0) * T, T);
        for (int t = r0; t < r1; ++t) {
          float* row = a + int64_t(t) * T;
          float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
          for (int s = 0; s <= t; ++s) mx = std::max(mx, row[s]);
          float sum = 0;
#pragma omp simd reduction(+ : sum)
          for (int s = 0; s <= t; ++s) {
            row[s] = fastmath::exp_fast(row[s] - mx);
            sum += row[s];
          }
          const float inv = 1.0f / sum;
#pragma omp simd
          for (int s = 0; s <= t; ++s) row[s] *= inv;
          std::fill(row + t + 1, row + T, 0.0f);
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r1 - r0, hs, r1, 1.0f, a + int64_t(r0) * T, T, v,
                    C3, 0.0f, y + int64_t(r0) * C, C);
      }
    }
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T, int C,
                        int NH) {
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(float(hs));
  const int C3 = 3 * C;
  SerialBlasScope serial_blas;
#pragma omp parallel for schedule(static) collapse(2)
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h) {
      const int64_t base = int64_t(b) * T * C3 + h * hs;
      const float *q = qkv + base, *k = q + C, *v = q + 2 * C;
      float *dq = dqkv + base, *dk = dq + C, *dv = dq + 2 * C;
      const float* a = att + (int64_t(b) * NH + h) * T * T;
      const float* dy = dout + int64_t(b) * T * C + h * hs;
      float* ds = scratch(size_t(T) * T).data();  // dscores [T, T]; only s < end of row block is set
      for (int r0 = 0; r0 < T; r0 += kAttBlock) {
        const int r1 = std::min(T, r0 + kAttBlock);
        float* dsb = ds + int64_t(r0) * T;
        // dP = dY V^T for queries [r0, r1), keys [0, r1)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r1 - r0, r1, hs, 1.0f, dy + int64_t(r0) * C, C, v, C3,
                    0.0f, dsb, T);
        for (int t = r0; t < r1; ++t) {
          const float* p = a + int64_t(t) * T;
          float* d = ds + int64_t(t) * T;
          float dot = 0;
#pragma omp simd reduction(+ : dot)
          for (int s = 0; s < r1; ++s) dot += p[s] * d[s];
          // p is 0 above the diagonal, so those dscores come out 0 as the mask requires.
#pragma omp simd
          for (int s = 0; s < r1; ++s) d[s] = p[s] * (d[s] - dot) * scale;
        }
        // dQ[r0:r1] += dS[r0:r1, 0:r1] @ K[0:r1]
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r1 - r0, hs, r1, 1.0f, dsb, T, k, C3, 1.0f,
                    dq + int64_t(r0) * C3, C3);
      }
      // Keys [c0, c1) receive gradient only from queries t >= c0; with equal row and column
      // blocks every dS entry read here was written above (rows t >= c0 cover keys < c1).
      for (int c0 = 0; c0 < T; c0 += kAttBlock) {
        const int c1 = std::min(T, c0 + kAttBlock);
        // dK[c0:c1] += dS[c0:T, c0:c1]^T @ Q[c0:T];  dV[c0:c1] += P[c0:T, c0:c1]^T @ dY[c0:T]
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, c1 - c0, hs, T - c0, 1.0f, ds + int64_t(c0) * T + c0,
                    T, q + int64_t(c0) * C3, C3, 1.0f, dk + int64_t(c0) * C3, C3);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, c1 - c0, hs, T - c0, 1.0f, a + int64_t(c0) * T + c0,
                    T, dy + int64_t(c0) * C, C, 1.0f, dv + int64_t(c0) * C3, C3);
      }
    }
}

void gelu_forward(float* out, const float* inp, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float x = inp[i];
    out[i] = 0.5f * x * (1.0f + fastmath::tanh_fast(kGeluC * (x + 0.044715f * x * x * x)));
  }
}

void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float x = inp[i];
    const float th = fastmath::tanh_fast(kGeluC * (x + 0.044715f * x * x * x));
    const float du = kGeluC * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] += (0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du) * dout[i];
  }
}

void residual_forward(float* out, const float* a, const float* b, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void residual_backward(float* da, float* db, const float* dout, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    da[i] += dout[i];
    db[i] += dout[i];
  }
}

void lm_head_forward(float* logits, const float* inp, const float* wte, int N, int C, int V) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, V, C, 1.0f, inp, C, wte, C, 0.0f, logits, V);
}

void lm_head_backward(float* dinp, float* dwte, const float* dlogits, const float* inp, const float* wte, int N,
                      int C, int V) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, V, 1.0f, dlogits, V, wte, C, 1.0f, dinp, C);
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, V, C, N, 1.0f, dlogits, V, inp, C, 1.0f, dwte, C);
}

float crossentropy_forward(float* probs, float* losses, const float* logits, const int32_t* targets, int N, int V) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* z = logits + int64_t(n) * V;
    float* p = probs + int64_t(n) * V;
    float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
    for (int v = 0; v < V; ++v) mx = std::max(mx, z[v]);
    const float zt = z[targets[n]];  // read before p (which may alias z) is written
    float sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int v = 0; v < V; ++v) {
      p[v] = fastmath::exp_fast(z[v] - mx);
      sum += p[v];
    }
    const float inv = 1.0f / sum;
#pragma omp simd
    for (int v = 0; v < V; ++v) p[v] *= inv;
    losses[n] = std::log(sum) + mx - zt;
  }
  double total = 0;  // in row order whatever the thread count
  for (int n = 0; n < N; ++n) total += losses[n];
  return float(total / N);
}

void crossentropy_backward(float* dlogits, const float* probs, const int32_t* targets, float dloss, int N, int V) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const float* p = probs + int64_t(n) * V;
    float* d = dlogits + int64_t(n) * V;
#pragma omp simd
    for (int v = 0; v < V; ++v) d[v] = p[v] * dloss;
    d[targets[n]] -= dloss;
  }
}

}  // namespace geoloco::trainer::fast

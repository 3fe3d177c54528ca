#include "trainer/model/kernels_ref.hpp"

#include <cmath>
#include <vector>

namespace geoloco::trainer::ref {

namespace {
constexpr double kLnEps = 1e-5;
constexpr double kGeluC = 0.7978845608028654;  // sqrt(2/pi)
}  // namespace

template <class F>
void encoder_forward(F* out, const int32_t* inp, const F* wte, const F* wpe, int B, int T, int C) {
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      const int64_t n = int64_t(b) * T + t;
      const F* e = wte + int64_t(inp[n]) * C;
      const F* p = wpe + int64_t(t) * C;
      for (int c = 0; c < C; ++c) out[n * C + c] = e[c] + p[c];
    }
}

template <class F>
void encoder_backward(F* dwte, F* dwpe, const F* dout, const int32_t* inp, int B, int T, int C) {
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      const int64_t n = int64_t(b) * T + t;
      F* de = dwte + int64_t(inp[n]) * C;
      F* dp = dwpe + int64_t(t) * C;
      for (int c = 0; c < C; ++c) {
        de[c] += dout[n * C + c];
        dp[c] += dout[n * C + c];
      }
    }
}

template <class F>
void layernorm_forward(F* out, F* mean, F* rstd, const F* inp, const F* w, const F* b, int N, int C) {
  for (int n = 0; n < N; ++n) {
    const F* x = inp + int64_t(n) * C;
    double m = 0;
    for (int c = 0; c < C; ++c) m += x[c];
    m /= C;
    double v = 0;
    for (int c = 0; c < C; ++c) v += (x[c] - m) * (x[c] - m);
    v /= C;
    const double s = 1.0 / std::sqrt(v + kLnEps);
    for (int c = 0; c < C; ++c) out[int64_t(n) * C + c] = F((x[c] - m) * s * w[c] + b[c]);
    mean[n] = F(m);
    rstd[n] = F(s);
  }
}

// With xhat = (x - mean) * rstd and g = dout * w:
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),  dw += dout * xhat,  db += dout.
template <class F>
void layernorm_backward(F* dinp, F* dw, F* db, const F* dout, const F* inp, const F* w, const F* mean,
                        const F* rstd, int N, int C) {
  for (int n = 0; n < N; ++n) {
    const F* x = inp + int64_t(n) * C;
    const F* dy = dout + int64_t(n) * C;
    const double m = mean[n], s = rstd[n];
    double g_mean = 0, gx_mean = 0;
    for (int c = 0; c < C; ++c) {
      const double xhat = (x[c] - m) * s;
      const double g = double(dy[c]) * w[c];
      g_mean += g;
      gx_mean += g * xhat;
    }
    g_mean /= C;
    gx_mean /= C;
    for (int c = 0; c < C; ++c) {
      const double xhat = (x[c] - m) * s;
      const double g = double(dy[c]) * w[c];
      dinp[int64_t(n) * C + c] += F(s * (g - g_mean - xhat * gx_mean));
      dw[c] += F(dy[c] * xhat);
      db[c] += dy[c];
    }
  }
}

template <class F>
void matmul_forward(F* out, const F* inp, const F* w, const F* bias, int N, int IC, int OC) {
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      double acc = bias ? double(bias[o]) : 0.0;
      for (int i = 0; i < IC; ++i) acc += double(inp[int64_t(n) * IC + i]) * w[int64_t(i) * OC + o];
      out[int64_t(n) * OC + o] = F(acc);
    }
}

template <class F>
void matmul_backward(F* dinp, F* dw, F* dbias, const F* dout, const F* inp, const F* w, int N, int IC, int OC) {
  for (int n = 0; n < N; ++n)
    for (int i = 0; i < IC; ++i) {
      double acc = 0;
      for (int o = 0; o < OC; ++o) acc += double(dout[int64_t(n) * OC + o]) * w[int64_t(i) * OC + o];
      dinp[int64_t(n) * IC + i] += F(acc);
    }
  for (int i = 0; i < IC; ++i)
    for (int o = 0; o < OC; ++o) {
      double acc = 0;
      for (int n = 0; n < N; ++n) acc += double(inp[int64_t(n) * IC + i]) * dout[int64_t(n) * OC + o];
      dw[int64_t(i) * OC + o] += F(acc);
    }
  if (dbias)
    for (int o = 0; o < OC; ++o) {
      double acc = 0;
      for (int n = 0; n < N; ++n) acc += dout[int64_t(n) * OC + o];
      dbias[o] += F(acc);
    }
}

template <class F>
void attention_forward(F* out, F* att, const F* qkv, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const double scale = 1.0 / std::sqrt(double(hs));
  const int64_t C3 = 3 * int64_t(C);
  std::vector<double> row(static_cast<size_t>(T));
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        const F* q = qkv + (int64_t(b) * T + t) * C3 + h * hs;
        double mx = -INFINITY;
        for (int s = 0; s <= t; ++s) {
          const F* k = qkv + (int64_t(b) * T + s) * C3 + C + h * hs;
          double d = 0;
          for (int i = 0; i < hs; ++i) d += double(q[i]) * k[i];
          row[s] = d * scale;
          mx = std::max(mx, row[s]);
        }
        double sum = 0;
        for (int s = 0; s <= t; ++s) {
          row[s] = std::exp(row[s] - mx);
          sum += row[s];
        }
        F* a = att + ((int64_t(b) * NH + h) * T + t) * T;
        for (int s = 0; s < T; ++s) a[s] = s <= t ? F(row[s] / sum) : F(0);
        F* y = out + (int64_t(b) * T + t) * C + h * hs;
        for (int i = 0; i < hs; ++i) {
          double acc = 0;
          for (int s = 0; s <= t; ++s) acc += double(a[s]) * qkv[(int64_t(b) * T + s) * C3 + 2 * C + h * hs + i];
          y[i] = F(acc);
        }
      }
}

// For one query row with probabilities p and dp = dL/dp:
//   dscore[s] = p[s] * (dp[s] - sum_s' p[s'] dp[s']); dq = scale * sum_s dscore[s] k_s;
//   dk_s += scale * dscore[s] q;  dv_s += p[s] * dy.
template <class F>
void attention_backward(F* dqkv, const F* dout, const F* qkv, const F* att, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const double scale = 1.0 / std::sqrt(double(hs));
  const int64_t C3 = 3 * int64_t(C);
  std::vector<double> dp(static_cast<size_t>(T));
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        const F* a = att + ((int64_t(b) * NH + h) * T + t) * T;
        const F* dy = dout + (int64_t(b) * T + t) * C + h * hs;
        const F* q = qkv + (int64_t(b) * T + t) * C3 + h * hs;
        double dot = 0;
        for (int s = 0; s <= t; ++s) {
          const F* v = qkv + (int64_t(b) * T + s) * C3 + 2 * C + h * hs;
          F* dv = dqkv + (int64_t(b) * T + s) * C3 + 2 * C + h * hs;
          double d = 0;
          for (int i = 0; i < hs; ++i) {
            d += double(dy[i]) * v[i];
            dv[i] += F(double(a[s]) * dy[i]);
          }
          dp[s] = d;
          dot += double(a[s]) * d;
        }
        F* dq = dqkv + (int64_t(b) * T + t) * C3 + h * hs;
        for (int s = 0; s <= t; ++s) {
          const double ds = double(a[s]) * (dp[s] - dot) * scale;
          const F* k = qkv + (int64_t(b) * T + s) * C3 + C + h * hs;
          F* dk = dqkv + (int64_t(b) * T + s) * C3 + C + h * hs;
          for (int i = 0; i < hs; ++i) {
            dq[i] += F(ds * k[i]);
            dk[i] += F(ds * q[i]);
          }
        }
      }
}

template <class F>
void gelu_forward(F* out, const F* inp, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double x = inp[i];
    out[i] = F(0.5 * x * (1.0 + std::tanh(kGeluC * (x + 0.044715 * x * x * x))));
  }
}

template <class F>
void gelu_backward(F* dinp, const F* inp, const F* dout, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double x = inp[i];
    const double u = kGeluC * (x + 0.044715 * x * x * x);
    const double th = std::tanh(u);
    const double du = kGeluC * (1.0 + 3.0 * 0.044715 * x * x);
    const double d = 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * du;
    dinp[i] += F(d * dout[i]);
  }
}

template <class F>
void residual_forward(F* out, const F* a, const F* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

template <class F>
void residual_backward(F* da, F* db, const F* dout, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    da[i] += dout[i];
    db[i] += dout[i];
  }
}

template <class F>
void lm_head_forward(F* logits, const F* inp, const F* wte, int N, int C, int V) {
  for (int n = 0; n < N; ++n)
    for (int v = 0; v < V; ++v) {
      double acc = 0;
      for (int c = 0; c < C; ++c) acc += double(inp[int64_t(n) * C + c]) * wte[int64_t(v) * C + c];
      logits[int64_t(n) * V + v] = F(acc);
    }
}

template <class F>
void lm_head_backward(F* dinp, F* dwte, const F* dlogits, const F* inp, const F* wte, int N, int C, int V) {
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c) {
      double acc = 0;
      for (int v = 0; v < V; ++v) acc += double(dlogits[int64_t(n) * V + v]) * wte[int64_t(v) * C + c];
      dinp[int64_t(n) * C + c] += F(acc);
    }
  for (int v = 0; v < V; ++v)
    for (int c = 0; c < C; ++c) {
      double acc = 0;
      for (int n = 0; n < N; ++n) acc += double(dlogits[int64_t(n) * V + v]) * inp[int64_t(n) * C + c];
      dwte[int64_t(v) * C + c] += F(acc);
    }
}

template <class F>
F crossentropy_forward(F* probs, F* losses, const F* logits, const int32_t* targets, int N, int V) {
  double total = 0;
  for (int n = 0; n < N; ++n) {
    const F* z = logits + int64_t(n) * V;
    double mx = -INFINITY;
    for (int v = 0; v < V; ++v) mx = std::max(mx, double(z[v]));
    double sum = 0;
    for (int v = 0; v < V; ++v) sum += std::exp(double(z[v]) - mx);
    // log-sum-exp form keeps the loss exact even where the target's probability underflows.
    const double loss = std::log(sum) + mx - double(z[targets[n]]);
    F* p = probs + int64_t(n) * V;
    for (int v = 0; v < V; ++v) p[v] = F(std::exp(double(z[v]) - mx) / sum);
    losses[n] = F(loss);
    total += loss;
  }
  return F(total / N);
}

template <class F>
void crossentropy_backward(F* dlogits, const F* probs, const int32_t* targets, F dloss, int N, int V) {
  for (int n = 0; n < N; ++n)
    for (int v = 0; v < V; ++v) {
      const double p = probs[int64_t(n) * V + v];
      dlogits[int64_t(n) * V + v] = F((p - (v == targets[n] ? 1.0 : 0.0)) * double(dloss));
    }
}

#define GEOLOCO_REF_INSTANTIATE(F)                                                                       \
  template void encoder_forward<F>(F*, const int32_t*, const F*, const F*, int, int, int);               \
  template void encoder_backward<F>(F*, F*, const F*, const int32_t*, int, int, int);                    \
  template void layernorm_forward<F>(F*, F*, F*, const F*, const F*, const F*, int, int);                \
  template void layernorm_backward<F>(F*, F*, F*, const F*, const F*, const F*, const F*, const F*, int, \
                                      int);                                                              \
  template void matmul_forward<F>(F*, const F*, const F*, const F*, int, int, int);                      \
  template void matmul_backward<F>(F*, F*, F*, const F*, const F*, const F*, int, int, int);             \
  template void attention_forward<F>(F*, F*, const F*, int, int, int, int);                              \
  template void attention_backward<F>(F*, const F*, const F*, const F*, int, int, int, int);             \
  template void gelu_forward<F>(F*, const F*, int64_t);                                                  \
  template void gelu_backward<F>(F*, const F*, const F*, int64_t);                                       \
  template void residual_forward<F>(F*, const F*, const F*, int64_t);                                    \
  template void residual_backward<F>(F*, F*, const F*, int64_t);                                         \
  template void lm_head_forward<F>(F*, const F*, const F*, int, int, int);                               \
  template void lm_head_backward<F>(F*, F*, const F*, const F*, const F*, int, int, int);                \
  template F crossentropy_forward<F>(F*, F*, const F*, const int32_t*, int, int);                        \
  template void crossentropy_backward<F>(F*, const F*, const int32_t*, F, int, int);

GEOLOCO_REF_INSTANTIATE(float)
GEOLOCO_REF_INSTANTIATE(double)
#undef GEOLOCO_REF_INSTANTIATE

}  // namespace geoloco::trainer::ref

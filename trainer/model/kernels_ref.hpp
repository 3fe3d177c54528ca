// Naive reference kernels for the GPT-2 forward and backward passes: plain loops,
// single-threaded, double accumulators. They are the oracle the fast kernels are tested
// against (and they are templated so tests can run them in double precision for tight
// finite-difference checks); the model's KernelPath::Reference runs them in float.
//
// Shapes (N = B*T rows, C channels, NH heads, hs = C/NH, V vocabulary):
//   activations are row-major [N, X]; linear weights are HF Conv1D [in, out].
// Conventions shared with kernels_fast.hpp:
//   * every *_backward ACCUMULATES (+=) into each gradient it produces, so callers zero
//     scratch gradients and parameter gradients accumulate over micro-batches;
//   * crossentropy_backward is the one exception: it WRITES dlogits (it starts the chain);
//   * token ids and targets must already be in [0, V) (Gpt::forward validates them).
#pragma once

#include <cstdint>

namespace geoloco::trainer::ref {

// out[b,t,:] = wte[inp[b,t],:] + wpe[t,:]
template <class F>
void encoder_forward(F* out, const int32_t* inp, const F* wte, const F* wpe, int B, int T, int C);
template <class F>
void encoder_backward(F* dwte, F* dwpe, const F* dout, const int32_t* inp, int B, int T, int C);

// out = (x - mean) * rstd * w + b per row, eps 1e-5; mean/rstd [N] are saved for backward.
template <class F>
void layernorm_forward(F* out, F* mean, F* rstd, const F* inp, const F* w, const F* b, int N, int C);
template <class F>
void layernorm_backward(F* dinp, F* dw, F* db, const F* dout, const F* inp, const F* w, const F* mean,
                        const F* rstd, int N, int C);

// out[N,OC] = inp[N,IC] @ w[IC,OC] + bias[OC]; bias may be null (and then dbias too).
template <class F>
void matmul_forward(F* out, const F* inp, const F* w, const F* bias, int N, int IC, int OC);
template <class F>
void matmul_backward(F* dinp, F* dw, F* dbias, const F* dout, const F* inp, const F* w, int N, int IC, int OC);

// Causal self-attention. qkv [N, 3C] holds q | k | v, head h in channels [h*hs, (h+1)*hs)
// of each. att [B, NH, T, T] receives the softmax probabilities (0 above the diagonal);
// out [N, C] the per-head outputs side by side. Scale 1/sqrt(hs).
template <class F>
void attention_forward(F* out, F* att, const F* qkv, int B, int T, int C, int NH);
template <class F>
void attention_backward(F* dqkv, const F* dout, const F* qkv, const F* att, int B, int T, int C, int NH);

// GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
template <class F>
void gelu_forward(F* out, const F* inp, int64_t n);
template <class F>
void gelu_backward(F* dinp, const F* inp, const F* dout, int64_t n);

// out = a + b
template <class F>
void residual_forward(F* out, const F* a, const F* b, int64_t n);
template <class F>
void residual_backward(F* da, F* db, const F* dout, int64_t n);

// Tied LM head: logits[N,V] = inp[N,C] @ wte[V,C]^T.
template <class F>
void lm_head_forward(F* logits, const F* inp, const F* wte, int N, int C, int V);
template <class F>
void lm_head_backward(F* dinp, F* dwte, const F* dlogits, const F* inp, const F* wte, int N, int C, int V);

// probs = softmax(logits) per row (probs may alias logits), losses[n] = -log probs[n, targets[n]];
// returns the mean loss over the N rows.
template <class F>
F crossentropy_forward(F* probs, F* losses, const F* logits, const int32_t* targets, int N, int V);
// dlogits = dloss * (probs - onehot(targets)), where dloss = d(total)/d(each row's loss)
// (loss_scale / N for a mean). Writes, does not accumulate; dlogits may alias probs.
template <class F>
void crossentropy_backward(F* dlogits, const F* probs, const int32_t* targets, F dloss, int N, int V);

}  // namespace geoloco::trainer::ref

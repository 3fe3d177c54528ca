// Fast CPU kernels for the GPT-2 forward and backward passes: the same operations and
// conventions as kernels_ref.hpp (read its header comment: backward kernels accumulate,
// crossentropy_backward writes), float only. GEMMs go through OpenBLAS (cblas_sgemm);
// everything else is a vectorizable loop threaded with OpenMP static schedules. No float
// atomics anywhere, so for a given thread count the results are the same bits every run.
#pragma once

#include <cstdint>

namespace geoloco::trainer::fast {

void encoder_forward(float* out, const int32_t* inp, const float* wte, const float* wpe, int B, int T, int C);
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* inp, int B, int T, int C);

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b,
                       int N, int C);
void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                        const float* mean, const float* rstd, int N, int C);

void matmul_forward(float* out, const float* inp, const float* w, const float* bias, int N, int IC, int OC);
void matmul_backward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp, const float* w,
                     int N, int IC, int OC);

void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH);
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T, int C,
                        int NH);

void gelu_forward(float* out, const float* inp, int64_t n);
void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n);

void residual_forward(float* out, const float* a, const float* b, int64_t n);
void residual_backward(float* da, float* db, const float* dout, int64_t n);

void lm_head_forward(float* logits, const float* inp, const float* wte, int N, int C, int V);
void lm_head_backward(float* dinp, float* dwte, const float* dlogits, const float* inp, const float* wte, int N,
                      int C, int V);

float crossentropy_forward(float* probs, float* losses, const float* logits, const int32_t* targets, int N, int V);
void crossentropy_backward(float* dlogits, const float* probs, const int32_t* targets, float dloss, int N, int V);

// Threads used by both OpenMP loops and OpenBLAS (process-wide settings of both libraries).
void set_num_threads(int n);
int num_threads();

}  // namespace geoloco::trainer::fast

// Host side of the CUDA ops: shapes, workspace, cuBLAS, launches and their error checks.
// Straightforward kernels (one warp or block per row for row-wise ops, grid-stride loops for
// elementwise ones) plus cuBLAS for every GEMM; correct and deterministic first. See
// docs/gpu.md for what to fuse next.
#include "trainer/cuda/ops.hpp"

#include <algorithm>
#include <cmath>

#include "trainer/cuda/cuda_check.hpp"
#include "trainer/cuda/attention_kernels.hpp"
#include "trainer/cuda/op_profile.hpp"
#include "trainer/cuda/ops_kernels.hpp"

namespace geoloco::cuda {

namespace {

void sub_mark(const OpContext& ctx, const char* op) {
  if (ctx.profile) ctx.profile->mark(op);
}

unsigned grid_for(int64_t n, int threads = kThreads) {
  return static_cast<unsigned>(std::clamp<int64_t>((n + threads - 1) / threads, 1, 65536));
}
unsigned grid_rows(int64_t rows, int rows_per_block) {
  return static_cast<unsigned>((rows + rows_per_block - 1) / rows_per_block);
}
// Row-wise kernels (GEOLOCO_FOR_ROWS / GEOLOCO_FOR_BT in ops_kernels.cu): x covers `cols`, y
// the rows (or t), z the batch; the kernels stride over whatever the grid does not cover.
constexpr int64_t kMaxGridYZ = 65535;
dim3 grid_cols_rows(int64_t cols, int64_t rows) {
  return dim3(grid_rows(cols, kThreads), static_cast<unsigned>(std::clamp<int64_t>(rows, 1, kMaxGridYZ)));
}
dim3 grid_cols_bt(int64_t cols, int B, int T) {
  return dim3(grid_rows(cols, kThreads), static_cast<unsigned>(std::clamp<int64_t>(T, 1, kMaxGridYZ)),
              static_cast<unsigned>(std::clamp<int64_t>(B, 1, kMaxGridYZ)));
}

// Carves the op workspace into aligned pieces and checks the total.
class Carver {
 public:
  Carver(const OpContext& ctx, const char* op) : ctx_(ctx), op_(op) {}
  template <class T>
  T* take(int64_t n) {
    const size_t at = (used_ + 255) & ~size_t(255);
    used_ = at + size_t(n) * sizeof(T);
    if (used_ > ctx_.work_bytes || ctx_.work == nullptr)
      throw Error(
          fmt::format(("{}: workspace of {} bytes is too small (needs at least {})"), op_, ctx_.work_bytes, used_));
    return reinterpret_cast<T*>(static_cast<char*>(ctx_.work) + at);
  }

 private:
  const OpContext& ctx_;
  const char* op_;
  size_t used_ = 0;
};

template <class A>
constexpr DType dtype_of() {
  return std::is_same_v<A, float> ? DType::F32 : DType::BF16;
}
cudaDataType_t cuda_type(DType t) { return t == DType::F32 ? CUDA_R_32F : CUDA_R_16BF; }

// Column sums into out_a (+= sum dout*xhat, when mean is set) and out_b (+= sum dout).
template <class A>
void column_sums(const OpContext& ctx, float* out_a, float* out_b, const A* dout, const A* inp, const float* mean,
                 const float* rstd, int N, int C, const char* op) {
  Carver w(ctx, op);
  float* pa = out_a ? w.take<float>(int64_t(kColumnChunks) * C) : nullptr;
  float* pb = w.take<float>(int64_t(kColumnChunks) * C);
  const dim3 grid((C + kColumnTile - 1) / kColumnTile, kColumnChunks);
  kern::column_partials<A>(grid, dim3(kColumnTile, kColumnLanes), ctx.stream, pa, pb, dout, inp, mean, rstd, N, C);
  check_launch(op);
  kern::column_finish((C + kThreads - 1) / kThreads, kThreads, ctx.stream, out_a, out_b, pa, pb, C);
  check_launch(op);
}

}  // namespace

size_t workspace_bytes(int B, int T, int C, int NH, int V, int act_bytes, bool fused_attention) {
  const size_t NC = size_t(B) * T * C, S = size_t(B) * NH * T * T;
  const size_t attention = fused_attention ? size_t(B) * NH * T * 4 + 256  // the backward's row dots
                                           : 7 * NC * act_bytes + S * (4 + act_bytes) + 16 * 256;  // + alignment
  const size_t columns = 2 * size_t(kColumnChunks) * 4 * C * 4 + 2 * 256;
  return std::max({attention, columns, size_t(256)});
}

void gemm(const OpContext& ctx, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const void* a, int lda,
          int64_t stride_a, const void* b, int ldb, int64_t stride_b, DType ab_type, float beta, void* c, int ldc,
          int64_t stride_c, DType c_type, int batch, const char* what) {
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands.
  const cublasStatus_t s = cublasGemmStridedBatchedEx(
      ctx.blas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, b,
      cuda_type(ab_type), ldb, stride_b, a, cuda_type(ab_type), lda, stride_a, &beta, c, cuda_type(c_type), ldc,
      stride_c, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (s != CUBLAS_STATUS_SUCCESS)
    raise_cublas(s, fmt::format("gemm {} (M {} N {} K {}, trans {}{}, batch {}, {} -> {})", what, M, N, K,
                                trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', batch,
                                ab_type == DType::F32 ? "fp32" : "bf16", c_type == DType::F32 ? "fp32" : "bf16"));
}

template <class A>
void encoder_forward(const OpContext& ctx, A* out, const int32_t* inp, const float* wte, const float* wpe, int B, int T,
                     int C) {
  kern::encoder_forward<A>(grid_cols_bt(C, B, T), kThreads, ctx.stream, out, inp, wte, wpe, B, T, C);
  check_launch("encoder_forward");
}

template <class A>
void encoder_backward(const OpContext& ctx, float* dwte, float* dwpe, const A* dout, const DeviceTokenBuckets& buckets,
                      int B, int T, int C) {
  const int64_t TC = int64_t(T) * C, N = int64_t(B) * T;
  GEOLOCO_CHECK(buckets.rows == N && buckets.packed != nullptr && buckets.groups >= 1 && buckets.groups <= N,
                "encoder_backward: token buckets for {} rows ({} groups), the batch has {}", buckets.rows,
                buckets.groups, N);
  kern::encoder_backward_wpe<A>(grid_rows(TC, kThreads), kThreads, ctx.stream, dwpe, dout, B, T, C);
  check_launch("encoder_backward (wpe)");
  const int32_t* rows = buckets.packed;
  kern::encoder_backward_wte<A>(static_cast<unsigned>(buckets.groups), kThreads, ctx.stream, dwte, dout, rows, rows + N,
                                rows + 2 * N + 1, C);
  check_launch("encoder_backward (wte)");
}

template <class A>
void layernorm_forward(const OpContext& ctx, A* out, float* mean, float* rstd, const A* inp, const float* w,
                       const float* b, int N, int C) {
  kern::layernorm_forward<A>(grid_rows(N, kThreads / 32), kThreads, ctx.stream, out, mean, rstd, inp, w, b, N, C);
  check_launch("layernorm_forward");
}

template <class A>
void layernorm_backward(const OpContext& ctx, A* dinp, float* dw, float* db, const A* dout, const A* inp,
                        const float* w, const float* mean, const float* rstd, int N, int C) {
  kern::layernorm_backward_dx<A>(grid_rows(N, kThreads / 32), kThreads, ctx.stream, dinp, dout, inp, w, mean, rstd, N,
                                 C);
  check_launch("layernorm_backward (dx)");
  sub_mark(ctx, "layernorm.bwd.params");
  column_sums<A>(ctx, dw, db, dout, inp, mean, rstd, N, C, "layernorm_backward (dw, db)");
}

template <class A>
void matmul_forward(const OpContext& ctx, A* out, const A* inp, const A* w, const float* bias, int N, int IC, int OC) {
  constexpr DType t = dtype_of<A>();
  gemm(ctx, false, false, N, OC, IC, 1.0f, inp, IC, 0, w, OC, 0, t, 0.0f, out, OC, 0, t, 1, "matmul_forward");
  if (bias) {
    const int threads_per_row = OC % 2 == 0 ? OC / 2 : OC;  // add_bias_k: column pairs when OC is even
    kern::add_bias<A>(grid_cols_rows(threads_per_row, N), kThreads, ctx.stream, out, bias, OC, N);
    check_launch("matmul_forward (bias)");
  }
}

template <class A>
void matmul_backward(const OpContext& ctx, A* dinp, float* dw, float* dbias, const A* dout, const A* inp, const A* w,
                     int N, int IC, int OC, bool overwrite) {
  constexpr DType t = dtype_of<A>();
  gemm(ctx, false, true, N, IC, OC, 1.0f, dout, OC, 0, w, OC, 0, t, overwrite ? 0.0f : 1.0f, dinp, IC, 0, t, 1,
       "matmul_backward (dinp)");
  gemm(ctx, true, false, IC, OC, N, 1.0f, inp, IC, 0, dout, OC, 0, t, 1.0f, dw, OC, 0, DType::F32, 1,
       "matmul_backward (dw)");
  if (dbias) sub_mark(ctx, "matmul.bias.bwd");
  if (dbias)
    column_sums<A>(ctx, nullptr, dbias, dout, static_cast<const A*>(nullptr), nullptr, nullptr, N, OC,
                   "matmul_backward (dbias)");
}

template <class A>
void attention_forward(const OpContext& ctx, A* out, A* att, const A* qkv, int B, int T, int C, int NH) {
  constexpr DType t = dtype_of<A>();
  const int hs = C / NH;
  const int64_t NC = int64_t(B) * T * C, BH = int64_t(B) * NH, TT = int64_t(T) * T, Th = int64_t(T) * hs;
  Carver w(ctx, "attention_forward");
  A* q = w.take<A>(NC);
  A* k = w.take<A>(NC);
  A* v = w.take<A>(NC);
  A* y = w.take<A>(NC);
  float* pre = w.take<float>(BH * TT);
  kern::split_heads<A>(grid_cols_bt(C, B, T), kThreads, ctx.stream, q, k, v, qkv, B, T, NH, hs);
  check_launch("attention_forward (split heads)");
  const float scale = 1.0f / sqrtf(float(hs));
  gemm(ctx, false, true, T, T, hs, scale, q, hs, Th, k, hs, Th, t, 0.0f, pre, T, TT, DType::F32, int(BH),
       "attention_forward (q k^T)");
  kern::causal_softmax<A>(grid_rows(BH * T, kThreads / 32), kThreads, ctx.stream, att, pre, BH * T, T);
  check_launch("attention_forward (softmax)");
  gemm(ctx, false, false, T, hs, T, 1.0f, att, T, TT, v, hs, Th, t, 0.0f, y, hs, Th, t, int(BH),
       "attention_forward (att v)");
  kern::merge_heads<A>(grid_cols_bt(C, B, T), kThreads, ctx.stream, out, y, B, T, NH, hs, C, 0, false);
  check_launch("attention_forward (merge heads)");
}

template <class A>
void attention_backward(const OpContext& ctx, A* dqkv, const A* dout, const A* qkv, const A* att, int B, int T, int C,
                        int NH, bool overwrite) {
  constexpr DType t = dtype_of<A>();
  const int hs = C / NH;
  const int64_t NC = int64_t(B) * T * C, BH = int64_t(B) * NH, TT = int64_t(T) * T, Th = int64_t(T) * hs;
  Carver w(ctx, "attention_backward");
  A* q = w.take<A>(NC);
  A* k = w.take<A>(NC);
  A* v = w.take<A>(NC);
  A* dy = w.take<A>(NC);
  A* dq = w.take<A>(NC);
  A* dk = w.take<A>(NC);
  A* dv = w.take<A>(NC);
  float* datt = w.take<float>(BH * TT);
  A* dpre = w.take<A>(BH * TT);
  kern::split_heads<A>(grid_cols_bt(C, B, T), kThreads, ctx.stream, q, k, v, qkv, B, T, NH, hs);
  check_launch("attention_backward (split heads)");
  kern::split_one<A>(grid_cols_bt(C, B, T), kThreads, ctx.stream, dy, dout, B, T, NH, hs);
  check_launch("attention_backward (split dout)");
  gemm(ctx, false, true, T, T, hs, 1.0f, dy, hs, Th, v, hs, Th, t, 0.0f, datt, T, TT, DType::F32, int(BH),
       "attention_backward (dy v^T)");
  gemm(ctx, true, false, T, hs, T, 1.0f, att, T, TT, dy, hs, Th, t, 0.0f, dv, hs, Th, t, int(BH),
       "attention_backward (att^T dy)");
  const float scale = 1.0f / sqrtf(float(hs));
  kern::causal_softmax_backward<A>(grid_rows(BH * T, kThreads / 32), kThreads, ctx.stream, dpre, att, datt, BH * T, T,
                                   scale);
  check_launch("attention_backward (softmax)");
  gemm(ctx, false, false, T, hs, T, 1.0f, dpre, T, TT, k, hs, Th, t, 0.0f, dq, hs, Th, t, int(BH),
       "attention_backward (dpre k)");
  gemm(ctx, true, false, T, hs, T, 1.0f, dpre, T, TT, q, hs, Th, t, 0.0f, dk, hs, Th, t, int(BH),
       "attention_backward (dpre^T q)");
  kern::merge_heads<A>(grid_cols_bt(C, B, T), kThreads, ctx.stream, dqkv, dq, B, T, NH, hs, 3 * C, 0, !overwrite);
  kern::merge_heads<A>(grid_cols_bt(C, B, T), kThreads, ctx.stream, dqkv, dk, B, T, NH, hs, 3 * C, C, !overwrite);
  kern::merge_heads<A>(grid_cols_bt(C, B, T), kThreads, ctx.stream, dqkv, dv, B, T, NH, hs, 3 * C, 2 * C, !overwrite);
  check_launch("attention_backward (merge heads)");
}

namespace {
void require_fused_fits(int C, int NH, const char* op) {
  GEOLOCO_CHECK(fused_attention_fits(C, NH), "{}: head size {} / {} must be a multiple of 16 and at most {}", op, C, NH,
                kFusedMaxHeadSize);
}
}  // namespace

void attention_forward_fused(const OpContext& ctx, bf16* out, float* lse, const bf16* qkv, int B, int T, int C,
                             int NH) {
  require_fused_fits(C, NH, "attention_forward_fused");
  kern::flash_forward(ctx.stream, out, lse, qkv, B, T, NH, C / NH);
  check_launch("attention_forward_fused");
}

void attention_backward_fused(const OpContext& ctx, bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out,
                              const float* lse, int B, int T, int C, int NH, bool overwrite) {
  require_fused_fits(C, NH, "attention_backward_fused");
  Carver w(ctx, "attention_backward_fused");
  float* dsum = w.take<float>(int64_t(B) * NH * T);
  kern::flash_backward_dot(ctx.stream, dsum, out, dout, B, T, NH, C / NH);
  check_launch("attention_backward_fused (row dots)");
  kern::flash_backward(ctx.stream, dqkv, qkv, dout, lse, dsum, B, T, NH, C / NH, !overwrite);
  check_launch("attention_backward_fused");
}

template <class A>
void gelu_forward(const OpContext& ctx, A* out, const A* inp, int64_t n) {
  kern::gelu_forward<A>(grid_for(n), kThreads, ctx.stream, out, inp, n);
  check_launch("gelu_forward");
}
template <class A>
void gelu_backward(const OpContext& ctx, A* dinp, const A* inp, const A* dout, int64_t n, bool overwrite) {
  kern::gelu_backward<A>(grid_for(n), kThreads, ctx.stream, dinp, inp, dout, n, overwrite);
  check_launch("gelu_backward");
}
template <class A>
void residual_forward(const OpContext& ctx, A* out, const A* a, const A* b, int64_t n) {
  kern::residual_forward<A>(grid_for(n), kThreads, ctx.stream, out, a, b, n);
  check_launch("residual_forward");
}
template <class A>
void residual_backward(const OpContext& ctx, A* da, A* db, const A* dout, int64_t n) {
  kern::residual_backward<A>(grid_for(n), kThreads, ctx.stream, da, db, dout, n);
  check_launch("residual_backward");
}

template <class A>
void lm_head_forward(const OpContext& ctx, A* logits, const A* inp, const A* wte, int N, int C, int V, int ldv,
                     bool padded_wte) {
  constexpr DType t = dtype_of<A>();
  if (ldv < 0) ldv = V;
  const int width = padded_wte ? ldv : V;
  gemm(ctx, false, true, N, width, C, 1.0f, inp, C, 0, wte, C, 0, t, 0.0f, logits, ldv, 0, t, 1, "lm_head_forward");
}
template <class A>
void lm_head_backward(const OpContext& ctx, A* dinp, float* dwte, const A* dlogits, const A* inp, const A* wte, int N,
                      int C, int V, int ldv, bool overwrite, bool padded_wte) {
  constexpr DType t = dtype_of<A>();
  if (ldv < 0) ldv = V;
  const int width = padded_wte ? ldv : V;  // the padding's zeros add nothing to dinp
  gemm(ctx, false, false, N, C, width, 1.0f, dlogits, ldv, 0, wte, C, 0, t, overwrite ? 0.0f : 1.0f, dinp, C, 0, t, 1,
       "lm_head_backward (dinp)");
  gemm(ctx, true, false, V, C, N, 1.0f, dlogits, ldv, 0, inp, C, 0, t, 1.0f, dwte, C, 0, DType::F32, 1,
       "lm_head_backward (dwte)");
}

template <class A>
void crossentropy_forward(const OpContext& ctx, A* probs, float* losses, const A* logits, const int32_t* targets, int N,
                          int V, int ldv) {
  if (ldv < 0) ldv = V;
  kern::crossentropy_forward<A>(N, 512, ctx.stream, probs, losses, logits, targets, V, ldv);
  check_launch("crossentropy_forward");
}
template <class A>
void crossentropy_backward(const OpContext& ctx, A* dlogits, const A* probs, const int32_t* targets, float dloss, int N,
                           int V, int ldv) {
  if (ldv < 0) ldv = V;
  const int threads_per_row = ldv % 2 == 0 ? ldv / 2 : ldv;  // crossentropy_backward_k: pairs when ldv is even
  kern::crossentropy_backward<A>(grid_cols_rows(threads_per_row, N), kThreads, ctx.stream, dlogits, probs, targets,
                                 dloss, V, ldv, N);
  check_launch("crossentropy_backward");
}

float mean_loss_to_host(const OpContext& ctx, const float* losses, int N) {
  Carver w(ctx, "mean_loss");
  float* d = w.take<float>(1);
  kern::mean(1, 1024, ctx.stream, d, losses, N);
  check_launch("mean_loss");
  float h = 0;
  check_cuda(cudaMemcpyAsync(&h, d, sizeof(float), cudaMemcpyDeviceToHost, ctx.stream), "mean_loss (copy)");
  check_cuda(cudaStreamSynchronize(ctx.stream), "mean_loss (synchronize)");
  return h;
}

double sum_squares_to_host(const OpContext& ctx, const float* x, int64_t n) {
  Carver w(ctx, "sum_squares");
  float* partial = w.take<float>(kSumBlocks);
  float* total = w.take<float>(1);
  // A fixed grid (not derived from the device) keeps the summation order, and so the bits,
  // the same on every GPU model.
  kern::sum_squares_partial(kSumBlocks, kThreads, ctx.stream, partial, x, n);
  check_launch("sum_squares (partials)");
  kern::sum_partials(1, kThreads, ctx.stream, total, partial, kSumBlocks);
  check_launch("sum_squares (total)");
  float h = 0;
  check_cuda(cudaMemcpyAsync(&h, total, sizeof(float), cudaMemcpyDeviceToHost, ctx.stream), "sum_squares (copy)");
  check_cuda(cudaStreamSynchronize(ctx.stream), "sum_squares (synchronize)");
  return h;
}

void scale_inplace(const OpContext& ctx, float* x, int64_t n, float s) {
  kern::scale(grid_for(n), kThreads, ctx.stream, x, n, s);
  check_launch("scale_inplace");
}

void cast_to_bf16(const OpContext& ctx, bf16* out, const float* in, int64_t n) {
  kern::cast_bf16(grid_for(n), kThreads, ctx.stream, out, in, n);
  check_launch("cast_to_bf16");
}
void cast_to_float(const OpContext& ctx, float* out, const bf16* in, int64_t n) {
  kern::cast_float(grid_for(n), kThreads, ctx.stream, out, in, n);
  check_launch("cast_to_float");
}

#define GEOLOCO_CUDA_OPS(A)                                                                                           \
  template void encoder_forward<A>(const OpContext&, A*, const int32_t*, const float*, const float*, int, int, int);  \
  template void encoder_backward<A>(const OpContext&, float*, float*, const A*, const DeviceTokenBuckets&, int, int,  \
                                    int);                                                                             \
  template void layernorm_forward<A>(const OpContext&, A*, float*, float*, const A*, const float*, const float*, int, \
                                     int);                                                                            \
  template void layernorm_backward<A>(const OpContext&, A*, float*, float*, const A*, const A*, const float*,         \
                                      const float*, const float*, int, int);                                          \
  template void matmul_forward<A>(const OpContext&, A*, const A*, const A*, const float*, int, int, int);             \
  template void matmul_backward<A>(const OpContext&, A*, float*, float*, const A*, const A*, const A*, int, int, int, \
                                   bool);                                                                             \
  template void attention_forward<A>(const OpContext&, A*, A*, const A*, int, int, int, int);                         \
  template void attention_backward<A>(const OpContext&, A*, const A*, const A*, const A*, int, int, int, int, bool);  \
  template void gelu_forward<A>(const OpContext&, A*, const A*, int64_t);                                             \
  template void gelu_backward<A>(const OpContext&, A*, const A*, const A*, int64_t, bool);                            \
  template void residual_forward<A>(const OpContext&, A*, const A*, const A*, int64_t);                               \
  template void residual_backward<A>(const OpContext&, A*, A*, const A*, int64_t);                                    \
  template void lm_head_forward<A>(const OpContext&, A*, const A*, const A*, int, int, int, int, bool);               \
  template void lm_head_backward<A>(const OpContext&, A*, float*, const A*, const A*, const A*, int, int, int, int,   \
                                    bool, bool);                                                                      \
  template void crossentropy_forward<A>(const OpContext&, A*, float*, const A*, const int32_t*, int, int, int);       \
  template void crossentropy_backward<A>(const OpContext&, A*, const A*, const int32_t*, float, int, int, int);

GEOLOCO_CUDA_OPS(float)
GEOLOCO_CUDA_OPS(bf16)
#undef GEOLOCO_CUDA_OPS

}  // namespace geoloco::cuda

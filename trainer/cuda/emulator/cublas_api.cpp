// The cuBLAS functions geoloco calls, on the host: handles bound to a stream and the strided
// batched GEMM (column-major, as cuBLAS): operands converted to fp32, multiplied by OpenBLAS
// (fp32 accumulation, its own summation order, as cuBLAS has its own), fp32 or bf16 output. Argument checks follow cuBLAS (negative sizes, short
// leading dimensions: CUBLAS_STATUS_INVALID_VALUE; other types: NOT_SUPPORTED); alpha and
// beta are read at the call (host pointer mode); with beta 0, C is not read (as cuBLAS: NaN
// in a fresh buffer does not propagate). The GEMM runs when its stream does.
#include <cblas.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

#include "trainer/cuda/emulator/device_state.hpp"

struct cublasContext {
  cudaStream_t stream = nullptr;
};

namespace {

using geoloco::cuda::emu::DeviceState;

float load(const void* p, cudaDataType t, int64_t i) {
  if (t == CUDA_R_32F) return static_cast<const float*>(p)[i];
  return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
}
void store(void* p, cudaDataType t, int64_t i, float v) {
  if (t == CUDA_R_32F)
    static_cast<float*>(p)[i] = v;
  else
    static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16(v);
}
int64_t elem_size(cudaDataType t) { return t == CUDA_R_32F ? 4 : 2; }

struct Gemm {
  bool ta, tb;
  int m, n, k;
  float alpha, beta;
  const void *a, *b;
  void* c;
  cudaDataType ab, ct;
  int lda, ldb, ldc;
  long long sa, sb, sc;
  int batch;

  // Bytes each operand spans over the whole batch (the last matrix's last element + 1).
  int64_t span(long long stride, int ld, int rows, int cols, cudaDataType t) const {
    if (rows == 0 || cols == 0 || batch == 0) return 0;
    return (stride * (batch - 1) + int64_t(ld) * (cols - 1) + rows) * elem_size(t);
  }

  void run() const {
    auto& d = DeviceState::get();
    const int ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
    const struct {
      const void* p;
      int64_t bytes;
      const char* name;
    } operands[] = {{a, span(sa, lda, ar, ac, ab), "A"},
                    {b, span(sb, ldb, br, bc, ab), "B"},
                    {c, span(sc, ldc, m, n, ct), "C"}};
    for (const auto& o : operands)
      if (o.bytes > 0 && !d.find(o.p, size_t(o.bytes)))
        throw std::runtime_error(fmt::format("cublasGemmStridedBatchedEx: {} ({}, {} bytes over the batch) is not inside "
                                             "one device allocation",
                                             o.name, o.p, o.bytes));
    std::vector<float> opa(size_t(m) * k), opb(size_t(k) * n), prod(size_t(m) * n);
    for (int bi = 0; bi < batch; ++bi) {
      const int64_t oa = int64_t(bi) * sa, ob = int64_t(bi) * sb, oc = int64_t(bi) * sc;
      // op(A) row-major [m][k], op(B) row-major [k][n]; prod = op(A) op(B) row-major [m][n].
      for (int i = 0; i < m; ++i)
        for (int p = 0; p < k; ++p)
          opa[size_t(i) * k + p] = load(a, ab, oa + (ta ? int64_t(i) * lda + p : int64_t(p) * lda + i));
      for (int p = 0; p < k; ++p)
        for (int j = 0; j < n; ++j)
          opb[size_t(p) * n + j] = load(b, ab, ob + (tb ? int64_t(p) * ldb + j : int64_t(j) * ldb + p));
      if (k > 0)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, opa.data(), k, opb.data(), n, 0.0f,
                    prod.data(), n);
      else
        std::fill(prod.begin(), prod.end(), 0.0f);
      for (int i = 0; i < m; ++i)
        for (int j = 0; j < n; ++j) {
          const float s = prod[size_t(i) * n + j];
          const int64_t at = oc + int64_t(j) * ldc + i;
          store(c, ct, at, beta == 0.0f ? alpha * s : alpha * s + beta * load(c, ct, at));
        }
    }
  }
};

}  // namespace

extern "C" {

cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
  if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
  *handle = new cublasContext();
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  auto& d = DeviceState::get();
  std::lock_guard lock(d.mu);
  if (!d.valid(stream)) return CUBLAS_STATUS_INVALID_VALUE;
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}

const char* cublasGetStatusName(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    default:
      return "CUBLAS_STATUS_UNKNOWN";
  }
}

const char* cublasGetStatusString(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS:
      return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "the library was not initialized";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "the functionality requested is not supported";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "the GPU program failed to execute";
    default:
      return "unknown error";
  }
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                          int m, int n, int k, const void* alpha, const void* A, cudaDataType Atype,
                                          int lda, long long int strideA, const void* B, cudaDataType Btype, int ldb,
                                          long long int strideB, const void* beta, void* C, cudaDataType Ctype,
                                          int ldc, long long int strideC, int batchCount,
                                          cublasComputeType_t computeType, cublasGemmAlgo_t) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  const auto op_ok = [](cublasOperation_t o) { return o == CUBLAS_OP_N || o == CUBLAS_OP_T; };
  if (!op_ok(transa) || !op_ok(transb) || m < 0 || n < 0 || k < 0 || batchCount < 0 || !alpha || !beta)
    return CUBLAS_STATUS_INVALID_VALUE;
  const bool ta = transa == CUBLAS_OP_T, tb = transb == CUBLAS_OP_T;
  if (lda < std::max(1, ta ? k : m) || ldb < std::max(1, tb ? n : k) || ldc < std::max(1, m))
    return CUBLAS_STATUS_INVALID_VALUE;
  const bool types = Atype == Btype && (Atype == CUDA_R_32F || Atype == CUDA_R_16BF) &&
                     (Ctype == CUDA_R_32F || (Ctype == CUDA_R_16BF && Atype == CUDA_R_16BF));
  if (!types || (computeType != CUBLAS_COMPUTE_32F && computeType != CUBLAS_COMPUTE_32F_PEDANTIC))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  auto& d = DeviceState::get();
  std::lock_guard lock(d.mu);
  if (d.sticky != cudaSuccess) return CUBLAS_STATUS_EXECUTION_FAILED;
  if (m == 0 || n == 0 || batchCount == 0) return CUBLAS_STATUS_SUCCESS;
  auto g = std::make_shared<Gemm>(Gemm{ta, tb, m, n, k, *static_cast<const float*>(alpha),
                                       *static_cast<const float*>(beta), A, B, C, Atype, Ctype, lda, ldb, ldc,
                                       strideA, strideB, strideC, batchCount});
  d.enqueue(d.resolve(handle->stream), "cublasGemmStridedBatchedEx", [g] { g->run(); });
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"

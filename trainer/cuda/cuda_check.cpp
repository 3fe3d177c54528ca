#include "trainer/cuda/cuda_check.hpp"

namespace geoloco::cuda {

static_assert(codes::kMemoryAllocation == cudaErrorMemoryAllocation);
static_assert(codes::kStubLibrary == cudaErrorStubLibrary);
static_assert(codes::kInsufficientDriver == cudaErrorInsufficientDriver);
static_assert(codes::kCallRequiresNewerDriver == cudaErrorCallRequiresNewerDriver);
static_assert(codes::kDevicesUnavailable == cudaErrorDevicesUnavailable);
static_assert(codes::kNoDevice == cudaErrorNoDevice);
static_assert(codes::kInvalidDevice == cudaErrorInvalidDevice);
static_assert(codes::kNoKernelImageForDevice == cudaErrorNoKernelImageForDevice);
static_assert(codes::kUnsupportedPtxVersion == cudaErrorUnsupportedPtxVersion);
static_assert(codes::kCublasAllocFailed == CUBLAS_STATUS_ALLOC_FAILED);
static_assert(codes::kCublasArchMismatch == CUBLAS_STATUS_ARCH_MISMATCH);

int current_device_or_minus1() {
  int d = -1;
  if (cudaGetDevice(&d) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  return d;
}

void raise_cuda(cudaError_t e, std::string_view op) {
  // Clear the (non-sticky) error so the next call reports its own status.
  (void)cudaGetLastError();
  throw_cuda_error(classify_cuda_status(static_cast<int>(e)), "CUDA", op, current_device_or_minus1(),
                   static_cast<int>(e), cudaGetErrorName(e), cudaGetErrorString(e));
}

void raise_cublas(cublasStatus_t s, std::string_view op) {
  throw_cuda_error(classify_cublas_status(static_cast<int>(s)), "cuBLAS", op, current_device_or_minus1(),
                   static_cast<int>(s), cublasGetStatusName(s), cublasGetStatusString(s));
}

}  // namespace geoloco::cuda

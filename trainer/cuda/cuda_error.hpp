// Typed CUDA / cuBLAS errors. Every failing runtime or cuBLAS call becomes one of these,
// carrying the operation (with shapes where the caller knows them), the device and the
// library's own code and text. Which class is thrown is decided from the numeric code by
// plain host code, so the mapping is tested on machines without a GPU.
//
//   CudaNoDevice      no driver / driver too old / no device / bad ordinal: run on CPU or fix
//                     CUDA_VISIBLE_DEVICES
//   CudaOutOfMemory   cudaMalloc / cuBLAS workspace allocation failed: smaller micro-batch
//   CudaArchMismatch  the binary has no kernel image for this GPU: rebuild with
//                     -DCMAKE_CUDA_ARCHITECTURES=<the GPU's sm>
//   CudaError         anything else (launch failure, illegal address, ...)
#pragma once

#include <string>
#include <string_view>

#include "core/error.hpp"

namespace geoloco::cuda {

enum class CudaErrorKind { NoDevice, OutOfMemory, ArchMismatch, Other };

// Numeric values of the cudaError_t / cublasStatus_t codes the classification needs; the CUDA
// library static_asserts that they match the toolkit's headers.
namespace codes {
constexpr int kMemoryAllocation = 2;
constexpr int kStubLibrary = 34;
constexpr int kInsufficientDriver = 35;
constexpr int kCallRequiresNewerDriver = 36;
constexpr int kDevicesUnavailable = 46;
constexpr int kNoDevice = 100;
constexpr int kInvalidDevice = 101;
constexpr int kNoKernelImageForDevice = 209;
constexpr int kUnsupportedPtxVersion = 222;
constexpr int kCublasAllocFailed = 3;
constexpr int kCublasArchMismatch = 8;
}  // namespace codes

CudaErrorKind classify_cuda_status(int cuda_error);
CudaErrorKind classify_cublas_status(int cublas_status);
const char* kind_name(CudaErrorKind k);

class CudaError : public Error {
 public:
  CudaError(CudaErrorKind kind, std::string op, int device, int code, const std::string& message)
      : Error(message), kind_(kind), op_(std::move(op)), device_(device), code_(code) {}
  CudaErrorKind kind() const { return kind_; }
  const std::string& op() const { return op_; }
  int device() const { return device_; }
  int code() const { return code_; }

 private:
  CudaErrorKind kind_;
  std::string op_;
  int device_;
  int code_;
};

class CudaNoDevice : public CudaError {
 public:
  using CudaError::CudaError;
};
class CudaOutOfMemory : public CudaError {
 public:
  using CudaError::CudaError;
};
class CudaArchMismatch : public CudaError {
 public:
  using CudaError::CudaError;
};

// Throws the class for `kind` with the message
//   "<library> error in <op> on device <d>: <code_name> (<code>): <text>[; <hint>]".
// device -1 means "not known yet" (e.g. before a device was selected).
[[noreturn]] void throw_cuda_error(CudaErrorKind kind, std::string_view library, std::string_view op, int device,
                                   int code, std::string_view code_name, std::string_view text);

}  // namespace geoloco::cuda

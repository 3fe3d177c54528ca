#include "trainer/cuda/cuda_error.hpp"

namespace geoloco::cuda {

CudaErrorKind classify_cuda_status(int e) {
  switch (e) {
    case codes::kMemoryAllocation:
      return CudaErrorKind::OutOfMemory;
    case codes::kStubLibrary:
    case codes::kInsufficientDriver:
    case codes::kCallRequiresNewerDriver:
    case codes::kDevicesUnavailable:
    case codes::kNoDevice:
    case codes::kInvalidDevice:
      return CudaErrorKind::NoDevice;
    case codes::kNoKernelImageForDevice:
    case codes::kUnsupportedPtxVersion:
      return CudaErrorKind::ArchMismatch;
    default:
      return CudaErrorKind::Other;
  }
}

CudaErrorKind classify_cublas_status(int s) {
  if (s == codes::kCublasAllocFailed) return CudaErrorKind::OutOfMemory;
  if (s == codes::kCublasArchMismatch) return CudaErrorKind::ArchMismatch;
  return CudaErrorKind::Other;
}

const char* kind_name(CudaErrorKind k) {
  switch (k) {
    case CudaErrorKind::NoDevice:
      return "no usable CUDA device";
    case CudaErrorKind::OutOfMemory:
      return "out of device memory";
    case CudaErrorKind::ArchMismatch:
      return "GPU architecture mismatch";
    case CudaErrorKind::Other:
      break;
  }
  return "CUDA failure";
}

namespace {
const char* hint(CudaErrorKind k) {
  switch (k) {
    case CudaErrorKind::NoDevice:
      return "; check the driver, nvidia-smi and CUDA_VISIBLE_DEVICES, or run with site.device: cpu";
    case CudaErrorKind::OutOfMemory:
      return "; lower train.micro_batch (or sequence length) or use bf16";
    case CudaErrorKind::ArchMismatch:
      return "; this build has no kernels for the GPU: reconfigure with -DCMAKE_CUDA_ARCHITECTURES=<its sm, e.g. 90>";
    case CudaErrorKind::Other:
      break;
  }
  return "";
}
}  // namespace

void throw_cuda_error(CudaErrorKind kind, std::string_view library, std::string_view op, int device, int code,
                      std::string_view code_name, std::string_view text) {
  const std::string dev = device >= 0 ? fmt::format("device {}", device) : std::string("device (none selected)");
  const std::string msg =
      fmt::format("{} error in {} on {}: {} ({}): {} [{}]{}", library, op, dev, code_name, code, text, kind_name(kind),
                  hint(kind));
  switch (kind) {
    case CudaErrorKind::NoDevice:
      throw CudaNoDevice(kind, std::string(op), device, code, msg);
    case CudaErrorKind::OutOfMemory:
      throw CudaOutOfMemory(kind, std::string(op), device, code, msg);
    case CudaErrorKind::ArchMismatch:
      throw CudaArchMismatch(kind, std::string(op), device, code, msg);
    case CudaErrorKind::Other:
      break;
  }
  throw CudaError(kind, std::string(op), device, code, msg);
}

}  // namespace geoloco::cuda

#include "trainer/cuda/device.hpp"

#include "trainer/cuda/cuda_check.hpp"
#include "trainer/cuda/device_select.hpp"

namespace geoloco::cuda {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

const char* built_architectures() { return GEOLOCO_CUDA_ARCHS; }

DeviceInfo device_info(int index) {
  if (index < 0) check_cuda(cudaGetDevice(&index), "cudaGetDevice");
  cudaDeviceProp p{};
  check_cuda(cudaGetDeviceProperties(&p, index), fmt::format("cudaGetDeviceProperties({})", index));
  DeviceInfo d;
  d.index = index;
  d.name = p.name;
  d.sm_major = p.major;
  d.sm_minor = p.minor;
  d.multiprocessors = p.multiProcessorCount;
  d.total_memory = p.totalGlobalMem;
  return d;
}

DeviceInfo select_device(int local_rank, int local_ranks, int requested) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) raise_cuda(e, fmt::format("cudaGetDeviceCount (local rank {})", local_rank));
  const int dev = device_for_local_rank(local_rank, local_ranks, n, requested);
  check_cuda(cudaSetDevice(dev), fmt::format("cudaSetDevice({}) for local rank {}", dev, local_rank));
  DeviceInfo info = device_info(dev);
  if (!arch_compatible(info.sm_major, info.sm_minor, GEOLOCO_CUDA_ARCHS))
    throw_cuda_error(CudaErrorKind::ArchMismatch, "CUDA", fmt::format("select_device (local rank {})", local_rank), dev,
                     codes::kNoKernelImageForDevice, "cudaErrorNoKernelImageForDevice",
                     fmt::format("{} is sm_{}{} but this build has kernels for CUDA architectures '{}' only", info.name,
                                 info.sm_major, info.sm_minor, GEOLOCO_CUDA_ARCHS));
  return info;
}

}  // namespace geoloco::cuda

namespace geoloco::cuda {
std::string no_device_reason() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return fmt::format("cudaGetDeviceCount failed: {} ({})", cudaGetErrorString(e), static_cast<int>(e));
  }
  return n == 0 ? "the CUDA runtime reports 0 devices" : "";
}
}  // namespace geoloco::cuda

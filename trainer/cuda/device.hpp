// Binding a rank to its GPU (CUDA builds only).
#pragma once

#include <cstddef>
#include <string>

namespace geoloco::cuda {

struct DeviceInfo {
  int index = -1;
  std::string name;
  int sm_major = 0, sm_minor = 0;
  int multiprocessors = 0;
  size_t total_memory = 0;
};

// Visible CUDA devices; 0 when the runtime reports an error (no driver, driver too old).
int device_count();

// Picks the GPU for local_rank (device_for_local_rank), makes it current for this thread,
// and checks that this build has kernels for it. Throws CudaNoDevice (none visible),
// ConfigError (more ranks than GPUs, bad pin), CudaArchMismatch (e.g. a build for sm_90 on
// an sm_80 GPU: rebuild with -DCMAKE_CUDA_ARCHITECTURES=80).
DeviceInfo select_device(int local_rank, int local_ranks, int requested = -1);

// Properties of a device (current one with index -1).
DeviceInfo device_info(int index = -1);

// The CMAKE_CUDA_ARCHITECTURES this library was compiled for.
const char* built_architectures();

}  // namespace geoloco::cuda

namespace geoloco::cuda {
// "" when at least one GPU is usable, else why not (the runtime's error text, "0 devices").
// GPU tests print it in GTEST_SKIP.
std::string no_device_reason();
}  // namespace geoloco::cuda

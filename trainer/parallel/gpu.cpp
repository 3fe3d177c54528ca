#include "trainer/parallel/gpu.hpp"

#ifdef GEOLOCO_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include <fmt/format.h>

namespace geoloco::parallel {

namespace {
struct Probe {
  int count = 0;
  std::string reason;
};

Probe probe() {
#ifdef GEOLOCO_HAVE_CUDA
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    // Reset the sticky error so later CUDA calls report their own problems.
    (void)cudaGetLastError();
    return {0, fmt::format("cudaGetDeviceCount failed: {} ({})", cudaGetErrorString(e), static_cast<int>(e))};
  }
  if (n == 0) return {0, "the CUDA runtime reports 0 devices"};
  return {n, ""};
#else
  return {0, "geoloco was built without CUDA (GEOLOCO_HAVE_CUDA off)"};
#endif
}
}  // namespace

int gpu_count() { return probe().count; }
bool gpu_available() { return gpu_count() > 0; }
std::string gpu_unavailable_reason() { return probe().reason; }

}  // namespace geoloco::parallel

#ifndef GEOLOCO_HAVE_CUDA
#include "trainer/parallel/errors.hpp"
#include "trainer/parallel/nccl_collective.hpp"

namespace geoloco::parallel {

std::unique_ptr<Collective> make_nccl(const RendezvousOptions& opts) {
  throw CollectiveError(fmt::format("site {} rank {}: the NCCL backend is not available: {}", opts.site, opts.rank,
                                    gpu_unavailable_reason()));
}

}  // namespace geoloco::parallel
#endif

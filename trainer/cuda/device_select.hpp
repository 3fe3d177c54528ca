// Which GPU a rank uses. One rank per GPU: the launcher starts at most as many ranks per node
// as the node has visible GPUs, and local rank r takes visible device r (CUDA_VISIBLE_DEVICES
// already renumbers them from 0). Pure host logic so the mapping is tested without a GPU.
#pragma once

namespace geoloco::cuda {

// local_rank in [0, local_ranks); device_count from cudaGetDeviceCount; requested >= 0 pins
// a device explicitly (site config), -1 means "by local rank".
// Throws CudaNoDevice when device_count is 0, ConfigError when the request cannot be met
// (more ranks than GPUs, a pinned device that is not visible), and Error for a local rank
// outside [0, local_ranks).
int device_for_local_rank(int local_rank, int local_ranks, int device_count, int requested = -1);

}  // namespace geoloco::cuda

#include <string_view>

namespace geoloco::cuda {

// Whether a binary built for CMAKE_CUDA_ARCHITECTURES `built` (e.g. "90", "80-real;90",
// "90-virtual") can run on a device of compute capability major.minor. An entry without a
// suffix carries both SASS and PTX, "-real" only SASS (runs on the same major with an equal
// or newer minor), "-virtual" only PTX (JIT-compiled for any equal or newer capability).
// Throws Error for an entry that is not of that form.
bool arch_compatible(int major, int minor, std::string_view built);

}  // namespace geoloco::cuda

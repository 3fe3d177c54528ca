// What the kernel files (*.cu) need beyond C++: under nvcc, CUDA itself; compiled by a host
// compiler (the CUDA emulator's build, trainer/cuda/emulator), a host definition of every
// CUDA construct they use. Kernels launch through GEOLOCO_LAUNCH instead of <<<...>>>, the
// only syntax a host compiler cannot parse:
//
//   GEOLOCO_LAUNCH(my_kernel<A>, grid, block, shared_bytes, stream)(arg0, arg1, ...);
#pragma once

#if defined(__CUDACC__)
#define GEOLOCO_LAUNCH(kernel, grid, block, shmem, stream) kernel<<<grid, block, shmem, stream>>>
#define GEOLOCO_UNROLL _Pragma("unroll")
#else
#define GEOLOCO_UNROLL
#include "trainer/cuda/emulator/kernel_emulation.hpp"
#endif

// Runs a kernel's grid on the host. Block 0 runs with every CUDA thread as a fiber (ucontext)
// on the calling OS thread: a thread that reaches __syncthreads or a warp shuffle suspends
// until its block (warp) has arrived, so barriers and shuffles have CUDA's semantics. When
// block 0 used neither, the remaining blocks run their threads one after another as plain
// calls (any order is a valid schedule for a kernel without barriers), which is ~100x
// faster; a later block that does synchronise is then reported, never run wrongly.
//
// Reported as EmulationError (the launch fails, the stream's error is set): a deadlock (no
// thread can proceed: a barrier or shuffle some threads never reach), a shuffle whose mask
// names an exited or missing lane or excludes the caller or the source lane, and the
// direct-mode case above. Exited threads count as arrived at __syncthreads (sm_70+).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace geoloco::cuda::emu {

struct KernelThread {
  uint3 thread_idx{0, 0, 0};
  uint3 block_idx{0, 0, 0};
  dim3 block_dim{1, 1, 1};
  dim3 grid_dim{1, 1, 1};
};
// The CUDA thread the calling OS thread is running right now (set before each resume).
inline thread_local KernelThread tl_kernel{};

struct EmulationError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void syncthreads();
uint32_t shfl_xor_bits(uint32_t mask, uint32_t bits, int lane_mask, int width);

struct PointerArg {
  int index;
  const void* ptr;
};

struct KernelLaunch {
  const char* name;
  dim3 grid, block;
  size_t shmem;
  cudaStream_t stream;
  std::vector<PointerArg> pointers;
  std::function<void()> body;
};

// Validates the configuration now (a bad one sets the launch error cudaGetLastError
// returns, as CUDA does) and enqueues the kernel on its stream (device_state.cpp).
void launch_kernel(KernelLaunch launch);

// Executes every block of the grid (called when the stream reaches the kernel). Throws
// EmulationError naming the kernel and the block.
void run_grid(const KernelLaunch& launch);

// The order threads of a fiber block resume in: shuffled every sweep from a seeded generator
// (default; GEOLOCO_CUDA_EMULATOR_SCHEDULE=ordered for thread order, GEOLOCO_CUDA_EMULATOR_SEED
// for another seed). Race-free kernels give the same bits either way; a kernel that reads
// shared memory another thread wrote without a barrier in between does not. Test hook:
void set_schedule(bool shuffled, uint64_t seed);

// How many blocks ran with fibers and how many as plain calls since the process started
// (for tests of the scheduler itself).
struct SchedulerCounts {
  uint64_t fiber_blocks = 0, direct_blocks = 0;
};
SchedulerCounts scheduler_counts();

}  // namespace geoloco::cuda::emu

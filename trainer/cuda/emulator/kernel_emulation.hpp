// Host definitions of the CUDA constructs the kernel files use, so a host compiler builds them
// for the emulator (included through trainer/cuda/kernel_lang.hpp, never directly). Each CUDA
// thread of a launch runs the kernel function with its own threadIdx; blocks run one after
// another; __syncthreads and warp shuffles suspend the calling thread (a fiber) until its
// block or warp has arrived (scheduler.hpp).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "trainer/cuda/emulator/scheduler.hpp"

// The CUDA headers define these as attributes a host compiler ignores (with a warning).
#undef __global__
#undef __device__
#undef __host__
#undef __shared__
#undef __forceinline__
#undef __launch_bounds__
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
// Blocks run one at a time on the launching OS thread and a block's CUDA threads are fibers of
// that OS thread: a thread-local static is exactly one block's shared memory.
#define __shared__ static thread_local

#define threadIdx (::geoloco::cuda::emu::tl_kernel.thread_idx)
#define blockIdx (::geoloco::cuda::emu::tl_kernel.block_idx)
#define blockDim (::geoloco::cuda::emu::tl_kernel.block_dim)
#define gridDim (::geoloco::cuda::emu::tl_kernel.grid_dim)

inline void __syncthreads() { ::geoloco::cuda::emu::syncthreads(); }

template <class T>
inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  static_assert(sizeof(T) == 4, "the emulator shuffles 32-bit values");
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  bits = ::geoloco::cuda::emu::shfl_xor_bits(mask, bits, lane_mask, width);
  std::memcpy(&v, &bits, 4);
  return v;
}

// Correctly rounded single operations (the host build compiles with -ffp-contract=off, so
// no contraction happens around them either).
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }

// Device-side min/max overloads.
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline long min(long a, long b) { return a < b ? a : b; }
inline long max(long a, long b) { return a > b ? a : b; }
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }

namespace geoloco::cuda::emu {

// A launch as `kernel<<<grid, block, shmem, stream>>>(args...)` performs it: the arguments
// are converted to the kernel's parameter types and copied now; the kernel runs when the
// stream reaches it. Pointer arguments must point into device memory when it runs.
template <class... P>
struct Launch {
  const char* name;
  void (*fn)(P...);
  dim3 grid, block;
  size_t shmem;
  cudaStream_t stream;

  template <class... A>
  void operator()(A&&... a) const {
    static_assert(sizeof...(A) == sizeof...(P), "kernel launched with the wrong number of arguments");
    auto args = std::make_shared<std::tuple<std::decay_t<P>...>>(std::forward<A>(a)...);
    std::vector<PointerArg> pointers;
    collect(*args, pointers, std::index_sequence_for<P...>{});
    auto fn_copy = fn;
    launch_kernel(KernelLaunch{name, grid, block, shmem, stream, std::move(pointers),
                               [fn_copy, args] { std::apply(fn_copy, *args); }});
  }

 private:
  template <class Tuple, size_t... I>
  static void collect(const Tuple& t, std::vector<PointerArg>& out, std::index_sequence<I...>) {
    (add_pointer(std::get<I>(t), int(I), out), ...);
  }
  template <class T>
  static void add_pointer(const T& v, int index, std::vector<PointerArg>& out) {
    if constexpr (std::is_pointer_v<T>) out.push_back({index, static_cast<const void*>(v)});
  }
};

template <class... P>
Launch<P...> make_launch(const char* name, void (*fn)(P...), dim3 grid, dim3 block, size_t shmem,
                         cudaStream_t stream) {
  return Launch<P...>{name, fn, grid, block, shmem, stream};
}

}  // namespace geoloco::cuda::emu

#define GEOLOCO_LAUNCH(kernel, grid, block, shmem, stream) \
  ::geoloco::cuda::emu::make_launch(#kernel, &kernel, dim3(grid), dim3(block), size_t(shmem), stream)

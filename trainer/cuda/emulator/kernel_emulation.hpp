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

inline void __syncwarp(unsigned mask = 0xffffffffu) { (void)::geoloco::cuda::emu::shfl_xor_bits(mask, 0, 0, 32); }

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

// Warp matrix operations (CUDA's <mma.h>, the bf16 16x16x16 shapes). On a device a fragment
// is spread over the warp's registers in an unspecified layout; here every lane holds the
// whole tile, so code must use fragments only through these calls (as portable code must).
// Each call is a warp convergence point (all 32 lanes, checked like a shuffle); a store
// writes from each lane only the elements "its" registers would hold (element e by lane
// e % 32), so reading another lane's part without __syncwarp reads stale memory, as on a GPU.
// Pointers must be 32-byte aligned and ldm a multiple of 16 bytes (CUDA's requirements).
namespace nvcuda::wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
  static_assert(M == 16 && N == 16 && K == 16, "the emulator has the 16x16x16 shape only");
  static constexpr int num_elements = 256;
  T x[256];
};

namespace detail {
inline void converge() { __syncwarp(); }
void check_pointer(const void* p, unsigned ldm, size_t elem, const char* what);  // scheduler.cpp
inline int lane() { return int(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) % 32; }
inline float to_float(float v) { return v; }
inline float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
}  // namespace detail

template <class Use, class T, class L>
inline void fill_fragment(fragment<Use, 16, 16, 16, T, L>& f, T v) {
  detail::converge();
  for (auto& e : f.x) e = v;
}

template <class Use, class T, class L>
inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, L>& f, const T* p, unsigned ldm) {
  static_assert(!std::is_same_v<Use, accumulator>, "an accumulator load takes a layout");
  detail::converge();
  detail::check_pointer(p, ldm, sizeof(T), "load_matrix_sync");
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c) f.x[r * 16 + c] = std::is_same_v<L, row_major> ? p[r * ldm + c] : p[c * ldm + r];
}

inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, const float* p, unsigned ldm, layout_t l) {
  detail::converge();
  detail::check_pointer(p, ldm, sizeof(float), "load_matrix_sync");
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c) f.x[r * 16 + c] = l == mem_row_major ? p[r * ldm + c] : p[c * ldm + r];
}

inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f, unsigned ldm, layout_t l) {
  detail::converge();
  detail::check_pointer(p, ldm, sizeof(float), "store_matrix_sync");
  for (int e = detail::lane(); e < 256; e += 32) {
    const int r = e / 16, c = e % 16;
    (l == mem_row_major ? p[r * ldm + c] : p[c * ldm + r]) = f.x[e];
  }
}

// d = a * b + c, fp32 accumulation in k order.
template <class T, class LA, class LB>
inline void mma_sync(fragment<accumulator, 16, 16, 16, float>& d, const fragment<matrix_a, 16, 16, 16, T, LA>& a,
                     const fragment<matrix_b, 16, 16, 16, T, LB>& b, const fragment<accumulator, 16, 16, 16, float>& c) {
  detail::converge();
  float out[256];
  for (int r = 0; r < 16; ++r)
    for (int col = 0; col < 16; ++col) {
      float s = c.x[r * 16 + col];
      for (int k = 0; k < 16; ++k) s += detail::to_float(a.x[r * 16 + k]) * detail::to_float(b.x[k * 16 + col]);
      out[r * 16 + col] = s;
    }
  for (int e = 0; e < 256; ++e) d.x[e] = out[e];
}
}  // namespace nvcuda::wmma

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

// The CUDA emulator's own semantics (trainer/cuda/emulator): the device the emulated tests run
// on really is the emulator; barriers and shuffles behave as on a GPU; what CUDA leaves
// undefined or forbids (deadlocks, shuffles naming exited lanes, host pointers in kernels,
// bad launch configurations, reading results without synchronising) is reported or visible.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "trainer/cuda/cuda_check.hpp"
#include "trainer/cuda/device.hpp"
#include "trainer/cuda/emulator/device_state.hpp"
#include "trainer/cuda/handles.hpp"
#include "trainer/cuda/kernel_lang.hpp"

namespace geoloco::cuda {
namespace {

// ---- kernels -------------------------------------------------------------------------

__global__ void rotate_k(int* out, int n) {
  __shared__ int sh[1024];
  const int i = int(threadIdx.x);
  sh[i] = i * 10;
  __syncthreads();
  out[blockIdx.x * n + i] = sh[(i + 1) % n];
}

__global__ void warp_sum_k(float* out, const float* in) {
  float v = in[blockIdx.x * blockDim.x + threadIdx.x];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  out[blockIdx.x * blockDim.x + threadIdx.x] = v;
}

__global__ void half_warp_exits_k(float* out) {
  if (threadIdx.x >= 16) return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}

__global__ void split_sync_k(float* out) {
  if (threadIdx.x < 16)
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
  else
    __syncthreads();
}

// Warp 0 writes the block's shared row, warp 1 reads it: with the barrier (sync) or without.
__global__ void publish_k(float* out, float v, bool sync) {
  __shared__ float row[32];
  const int lane = int(threadIdx.x) % 32;
  if (threadIdx.x < 32) row[lane] = v;
  if (sync) __syncthreads();
  if (threadIdx.x >= 32) out[lane] = row[lane];
  __syncwarp();  // every launch synchronises somewhere: block 0 runs with fibers
}

__global__ void fill_k(float* out, float v, int n) {
  const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) out[i] = v;
}

__global__ void sync_only_after_block0_k(float* out) {
  if (blockIdx.x > 0) __syncthreads();
  out[blockIdx.x * blockDim.x + threadIdx.x] = 1.0f;
}

#define GEOLOCO_REQUIRE_EMULATOR()            \
  do {                                        \
    emu::reset_for_tests();                   \
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess); \
  } while (0)

std::vector<float> download(const float* d, size_t n) {
  std::vector<float> h(n);
  check_cuda(cudaMemcpy(h.data(), d, n * 4, cudaMemcpyDeviceToHost), "download");
  return h;
}

// ---- tests ---------------------------------------------------------------------------

TEST(CudaEmulator, TheEmulatedTestsRunOnTheEmulatorNotOnTheCudaRuntime) {
  // The emulator's objects must take precedence over libcudart in every emulated binary.
  cudaDeviceProp p{};
  ASSERT_EQ(cudaGetDeviceProperties(&p, 0), cudaSuccess);
  EXPECT_STREQ(p.name, "geoloco CUDA emulator (host)");
  EXPECT_TRUE(no_device_reason().empty()) << no_device_reason();
  EXPECT_EQ(select_device(0, 1).sm_major, 9);
}

TEST(CudaEmulator, BarrierOrdersSharedMemoryWithinEachBlock) {
  GEOLOCO_REQUIRE_EMULATOR();
  const int n = 96, blocks = 3;
  DeviceBuffer<int> out(size_t(n) * blocks, "out");
  GEOLOCO_LAUNCH(rotate_k, blocks, n, 0, nullptr)(out.data(), n);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  std::vector<int> h(size_t(n) * blocks);
  check_cuda(cudaMemcpy(h.data(), out.data(), h.size() * 4, cudaMemcpyDeviceToHost), "download");
  for (int b = 0; b < blocks; ++b)
    for (int i = 0; i < n; ++i) ASSERT_EQ(h[size_t(b * n + i)], ((i + 1) % n) * 10) << "block " << b << " thread " << i;
}

TEST(CudaEmulator, ButterflyShuffleGivesEveryLaneTheWarpSum) {
  GEOLOCO_REQUIRE_EMULATOR();
  std::vector<float> in(128);
  for (size_t i = 0; i < in.size(); ++i) in[i] = float(i);
  DeviceBuffer<float> din(in.size(), "in"), dout(in.size(), "out");
  check_cuda(cudaMemcpy(din.data(), in.data(), in.size() * 4, cudaMemcpyHostToDevice), "upload");
  GEOLOCO_LAUNCH(warp_sum_k, 2, 64, 0, nullptr)(dout.data(), din.data());
  const auto h = download(dout.data(), in.size());
  for (size_t i = 0; i < h.size(); ++i) {
    const size_t w = i / 32;
    const float want = float(32 * (32 * w) + 31 * 32 / 2);
    ASSERT_EQ(h[i], want) << "thread " << i;
  }
}

TEST(CudaEmulator, AShuffleNamingLanesThatExitedFailsTheLaunch) {
  GEOLOCO_REQUIRE_EMULATOR();
  DeviceBuffer<float> out(32, "out");
  GEOLOCO_LAUNCH(half_warp_exits_k, 1, 32, 0, nullptr)(out.data());
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);  // the launch itself is valid
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
  EXPECT_NE(emu::failure_message().find("half_warp_exits_k"), std::string::npos) << emu::failure_message();
  // Which side reports it depends on the schedule: a lane exits while others wait, or a lane
  // arrives after one it names has exited.
  const std::string m = emu::failure_message();
  EXPECT_NE(m.find("__shfl_xor_sync(mask 0xffffffff)"), std::string::npos) << m;
  EXPECT_NE(m.find("exited"), std::string::npos) << m;
  // The context is unusable afterwards, as after a device fault.
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, 16), cudaErrorLaunchFailure);
}

TEST(CudaEmulator, ADeadlockIsReportedNamingTheKernelAndBlock) {
  GEOLOCO_REQUIRE_EMULATOR();
  DeviceBuffer<float> out(32, "out");
  GEOLOCO_LAUNCH(split_sync_k, 1, 32, 0, nullptr)(out.data());
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
  const std::string m = emu::failure_message();
  EXPECT_NE(m.find("split_sync_k block (0,0,0): deadlock: 16 threads wait at __syncthreads, 16 at a warp shuffle"),
            std::string::npos)
      << m;
}

TEST(CudaEmulator, ABlockThatSynchronisesWhenBlockZeroDidNotIsReportedNotRunWrongly) {
  GEOLOCO_REQUIRE_EMULATOR();
  DeviceBuffer<float> out(64, "out");
  GEOLOCO_LAUNCH(sync_only_after_block0_k, 2, 32, 0, nullptr)(out.data());
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
  EXPECT_NE(emu::failure_message().find("block (1,0,0)"), std::string::npos) << emu::failure_message();
}

// The shuffled schedule (the default) exposes a missing barrier that thread order hides: the
// reading warp then sometimes runs before the writing one and sees the previous launch's value.
TEST(CudaEmulator, AShuffledScheduleExposesAMissingBarrier) {
  GEOLOCO_REQUIRE_EMULATOR();
  DeviceBuffer<float> out(32, "out");
  const auto stale_reads = [&](bool sync) {
    int stale = 0;
    for (int launch = 1; launch <= 8; ++launch) {
      GEOLOCO_LAUNCH(publish_k, 1, 64, 0, nullptr)(out.data(), float(launch), sync);
      for (float x : download(out.data(), 32)) stale += x != float(launch);
    }
    return stale;
  };
  emu::set_schedule(/*shuffled=*/false, 1);
  EXPECT_EQ(stale_reads(false), 0) << "thread order hides the race";
  emu::set_schedule(/*shuffled=*/true, 1);
  EXPECT_GT(stale_reads(false), 0) << "the shuffled schedule must expose it";
  EXPECT_EQ(stale_reads(true), 0) << "with the barrier every read is right in every schedule";
}

TEST(CudaEmulator, KernelsWithoutBarriersRunBlocksAfterTheFirstAsPlainCalls) {
  GEOLOCO_REQUIRE_EMULATOR();
  const int n = 1000;
  DeviceBuffer<float> out(n, "out");
  const auto before = emu::scheduler_counts();
  GEOLOCO_LAUNCH(fill_k, 4, 256, 0, nullptr)(out.data(), 2.5f, n);
  const auto h = download(out.data(), n);
  const auto after = emu::scheduler_counts();
  for (float v : h) ASSERT_EQ(v, 2.5f);
  EXPECT_EQ(after.fiber_blocks - before.fiber_blocks, 1u);
  EXPECT_EQ(after.direct_blocks - before.direct_blocks, 3u);
}

TEST(CudaEmulator, AHostPointerPassedToAKernelIsAnIllegalAddress) {
  GEOLOCO_REQUIRE_EMULATOR();
  std::vector<float> host(32);
  GEOLOCO_LAUNCH(fill_k, 1, 32, 0, nullptr)(host.data(), 1.0f, 32);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorIllegalAddress);
  EXPECT_NE(emu::failure_message().find("fill_k: argument 0"), std::string::npos) << emu::failure_message();
  EXPECT_EQ(host[0], 0.0f);  // nothing was written
}

TEST(CudaEmulator, AnInvalidLaunchConfigurationIsReportedAtTheLaunch) {
  GEOLOCO_REQUIRE_EMULATOR();
  DeviceBuffer<float> out(1, "out");
  GEOLOCO_LAUNCH(fill_k, dim3(1, 70000), 32, 0, nullptr)(out.data(), 1.0f, 1);  // grid.y > 65535
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  GEOLOCO_LAUNCH(fill_k, 1, 2048, 0, nullptr)(out.data(), 1.0f, 1);  // > 1024 threads
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);                      // not sticky
  GEOLOCO_LAUNCH(fill_k, 0, 32, 0, nullptr)(out.data(), 1.0f, 1);  // empty grid
  EXPECT_THROW(check_launch("bad launch"), CudaError);
}

TEST(CudaEmulator, WorkRunsOnlyWhenTheHostSynchronises) {
  GEOLOCO_REQUIRE_EMULATOR();
  Stream s("test");
  DeviceBuffer<float> d(8, "d");
  PinnedBuffer<float> h(8, "h");
  std::memset(h.data(), 0, 8 * 4);
  GEOLOCO_LAUNCH(fill_k, 1, 32, 0, s.get())(d.data(), 7.0f, 8);
  check_cuda(cudaMemcpyAsync(h.data(), d.data(), 8 * 4, cudaMemcpyDeviceToHost, s.get()), "copy");
  EXPECT_EQ(h.data()[0], 0.0f) << "the copy into pinned memory is asynchronous";
  s.synchronize("sync");
  EXPECT_EQ(h.data()[0], 7.0f);
}

TEST(CudaEmulator, AStreamRunsAheadOfAnotherUnlessItWaitsForItsEvent) {
  GEOLOCO_REQUIRE_EMULATOR();
  Stream a("a"), b("b");
  DeviceBuffer<float> d(8, "d");
  PinnedBuffer<float> h(8, "h");
  // Without an event: b's copy runs when b is synchronised, before a's kernel ever ran.
  GEOLOCO_LAUNCH(fill_k, 1, 32, 0, a.get())(d.data(), 3.0f, 8);
  check_cuda(cudaMemcpyAsync(h.data(), d.data(), 32, cudaMemcpyDeviceToHost, b.get()), "copy");
  b.synchronize("b");
  EXPECT_TRUE(std::isnan(h.data()[0])) << "fresh device memory reads as NaN: " << h.data()[0];
  a.synchronize("a");
  // With the event: b waits for a.
  Event done;
  GEOLOCO_LAUNCH(fill_k, 1, 32, 0, a.get())(d.data(), 4.0f, 8);
  done.record(a.get());
  done.make_wait(b.get());
  check_cuda(cudaMemcpyAsync(h.data(), d.data(), 32, cudaMemcpyDeviceToHost, b.get()), "copy");
  b.synchronize("b");
  EXPECT_EQ(h.data()[0], 4.0f);
}

TEST(CudaEmulator, CopiesWhoseKindContradictsThePointersAreRejected) {
  GEOLOCO_REQUIRE_EMULATOR();
  DeviceBuffer<float> d(4, "d");
  std::vector<float> h(4);
  EXPECT_EQ(cudaMemcpy(d.data(), h.data(), 16, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(h.data(), d.data(), 32, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);  // past the end
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(h.data(), d.data(), 16, cudaMemcpyDeviceToHost), cudaSuccess);
}

// A host buffer may start exactly where a device allocation ends (the TSan allocator placed
// them so): the end is not inside the allocation.
TEST(CudaEmulator, TheEndOfAnAllocationIsNotInsideIt) {
  GEOLOCO_REQUIRE_EMULATOR();
  DeviceBuffer<char> d(100, "d");
  auto& state = emu::DeviceState::get();
  std::lock_guard lock(state.mu);
  EXPECT_NE(state.find(d.data(), 100), nullptr);
  EXPECT_NE(state.find(d.data() + 99, 0), nullptr);
  EXPECT_EQ(state.find(d.data() + 100, 0), nullptr);
  EXPECT_EQ(state.find(d.data() + 1, 100), nullptr);
}

TEST(CudaEmulator, AllocationsBeyondTheDeviceMemoryFail) {
  GEOLOCO_REQUIRE_EMULATOR();
  size_t free = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free, &total), cudaSuccess);
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, total + 1), cudaErrorMemoryAllocation);
  EXPECT_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
  EXPECT_EQ(cudaMalloc(&p, 1024), cudaSuccess);
  EXPECT_EQ(cudaFree(p), cudaSuccess);
}

// A column-major reference for one cuBLAS call.
std::vector<float> ref_gemm(bool ta, bool tb, int m, int n, int k, const std::vector<float>& a, int lda,
                            const std::vector<float>& b, int ldb, std::vector<float> c, int ldc, float alpha,
                            float beta) {
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double s = 0;
      for (int p = 0; p < k; ++p)
        s += double(ta ? a[size_t(i) * lda + p] : a[size_t(p) * lda + i]) *
             double(tb ? b[size_t(p) * ldb + j] : b[size_t(j) * ldb + p]);
      float& x = c[size_t(j) * ldc + i];
      x = float(alpha * s + (beta == 0.0f ? 0.0 : double(beta) * x));
    }
  return c;
}

TEST(CudaEmulator, GemmFollowsCublasColumnMajorSemanticsForEveryTransposition) {
  GEOLOCO_REQUIRE_EMULATOR();
  CublasHandle blas(nullptr);
  const int m = 5, n = 3, k = 4, ld = 8;
  std::vector<float> a(size_t(ld) * ld), b(size_t(ld) * ld), c(size_t(ld) * ld);
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = float(int(i % 7) - 3);
    b[i] = float(int(i % 5) - 2) * 0.5f;
    c[i] = float(i % 3);
  }
  DeviceBuffer<float> da(a.size(), "a"), db(b.size(), "b"), dc(c.size(), "c");
  check_cuda(cudaMemcpy(da.data(), a.data(), a.size() * 4, cudaMemcpyHostToDevice), "a");
  check_cuda(cudaMemcpy(db.data(), b.data(), b.size() * 4, cudaMemcpyHostToDevice), "b");
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      check_cuda(cudaMemcpy(dc.data(), c.data(), c.size() * 4, cudaMemcpyHostToDevice), "c");
      const float alpha = 1.5f, beta = ta ? 0.0f : 0.5f;
      ASSERT_EQ(
          cublasGemmStridedBatchedEx(blas.get(), ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n,
                                     k, &alpha, da.data(), CUDA_R_32F, ld, 0, db.data(), CUDA_R_32F, ld, 0, &beta,
                                     dc.data(), CUDA_R_32F, ld, 0, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          CUBLAS_STATUS_SUCCESS);
      const auto got = download(dc.data(), c.size());
      const auto want = ref_gemm(ta, tb, m, n, k, a, ld, b, ld, c, ld, alpha, beta);
      for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << "ta " << ta << " tb " << tb << " at " << i;
    }
  const float one = 1.0f;
  EXPECT_EQ(cublasGemmStridedBatchedEx(blas.get(), CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, da.data(), CUDA_R_32F,
                                       m - 1, 0, db.data(), CUDA_R_32F, ld, 0, &one, dc.data(), CUDA_R_32F, ld, 0, 1,
                                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_INVALID_VALUE)
      << "lda below m";
}

// cudaEventElapsedTime's contract (what OpProfile relies on): both events recorded with
// timing and completed; before a synchronisation the emulated device has not run them.
TEST(CudaEmulator, EventElapsedTimeNeedsTimingEventsThatCompleted) {
  GEOLOCO_REQUIRE_EMULATOR();
  Stream s("s");
  DeviceBuffer<float> d(8, "d");
  Event a(/*timing=*/true), b(/*timing=*/true), plain;
  float ms = -1;
  EXPECT_EQ(cudaEventElapsedTime(&ms, a.get(), b.get()), cudaErrorInvalidResourceHandle);  // never recorded
  (void)cudaGetLastError();
  a.record(s.get());
  GEOLOCO_LAUNCH(fill_k, 1, 32, 0, s.get())(d.data(), 1.0f, 8);
  b.record(s.get());
  EXPECT_EQ(cudaEventElapsedTime(&ms, a.get(), b.get()), cudaErrorNotReady);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "not ready is not an error state";
  b.synchronize();
  ASSERT_EQ(cudaEventElapsedTime(&ms, a.get(), b.get()), cudaSuccess);
  EXPECT_GE(ms, 0.0f);
  plain.record(s.get());
  plain.synchronize();
  EXPECT_EQ(cudaEventElapsedTime(&ms, a.get(), plain.get()), cudaErrorInvalidResourceHandle);  // timing disabled
  EXPECT_EQ(cudaEventElapsedTime(nullptr, a.get(), b.get()), cudaErrorInvalidValue);
  (void)cudaGetLastError();
  // A pending record outlives its event: destroying it before the stream ran is safe.
  {
    Event gone(/*timing=*/true);
    gone.record(s.get());
  }
  s.synchronize("s");
}

}  // namespace
}  // namespace geoloco::cuda

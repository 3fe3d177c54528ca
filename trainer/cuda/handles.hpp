// RAII owners for every CUDA handle the backend uses: device buffers (plain and
// stream-ordered), pinned host buffers, streams, events and the cuBLAS handle. Move-only; destructors never throw (a failing
// free during unwinding would hide the original error), constructors throw typed errors.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>

#include "trainer/cuda/cuda_check.hpp"

namespace geoloco::cuda {

namespace detail {

// An owned array of n elements of T whose memory comes from Alloc (below): move-only, freed
// by reset() or the destructor (never throwing). Alloc may carry state (a stream).
template <class T, class Alloc>
class OwnedArray : private Alloc {
 public:
  OwnedArray() = default;
  ~OwnedArray() { reset(); }
  OwnedArray(OwnedArray&& o) noexcept
      : Alloc(static_cast<const Alloc&>(o)), p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  OwnedArray& operator=(OwnedArray&& o) noexcept {
    if (this != &o) {
      reset();
      Alloc::operator=(static_cast<const Alloc&>(o));
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  OwnedArray(const OwnedArray&) = delete;
  OwnedArray& operator=(const OwnedArray&) = delete;

  T* data() { return p_; }
  const T* data() const { return p_; }
  size_t size() const { return n_; }
  // Device arrays: a span over device memory: pass it on, never dereference it on the host.
  std::span<T> span() { return {p_, n_}; }
  std::span<const T> span() const { return {p_, n_}; }
  void reset() noexcept {
    if (p_) Alloc::release(p_);
    p_ = nullptr;
    n_ = 0;
  }

 protected:
  OwnedArray(Alloc alloc, size_t n, std::string_view what) : Alloc(alloc), n_(n) {
    if (n > 0) p_ = static_cast<T*>(Alloc::allocate(n * sizeof(T), n, what));
  }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

struct DeviceAlloc {
  static void* allocate(size_t bytes, size_t n, std::string_view what) {
    void* p = nullptr;
    check_cuda(cudaMalloc(&p, bytes), fmt::format("cudaMalloc {} ({} elements, {} bytes)", what, n, bytes));
    return p;
  }
  static void release(void* p) noexcept { (void)cudaFree(p); }
};

struct StreamAlloc {
  cudaStream_t stream = nullptr;
  void* allocate(size_t bytes, size_t n, std::string_view what) const {
    void* p = nullptr;
    check_cuda(cudaMallocAsync(&p, bytes, stream),
               fmt::format("cudaMallocAsync {} ({} elements, {} bytes)", what, n, bytes));
    return p;
  }
  void release(void* p) const noexcept { (void)cudaFreeAsync(p, stream); }
};

struct PinnedAlloc {
  static void* allocate(size_t bytes, size_t, std::string_view what) {
    void* p = nullptr;
    check_cuda(cudaMallocHost(&p, bytes), fmt::format("cudaMallocHost {} ({} bytes)", what, bytes));
    return p;
  }
  static void release(void* p) noexcept { (void)cudaFreeHost(p); }
};

}  // namespace detail

// cudaMalloc'd array of n elements (uninitialised). `what` names it in an out-of-memory error.
template <class T>
class DeviceBuffer : public detail::OwnedArray<T, detail::DeviceAlloc> {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n, std::string_view what = "device buffer")
      : detail::OwnedArray<T, detail::DeviceAlloc>(detail::DeviceAlloc{}, n, what) {}
};

// Stream-ordered device array (cudaMallocAsync / cudaFreeAsync on `stream`) for buffers that
// live for part of a step (zero2's full gradient, fsdp's gathered parameters). Freed blocks go
// back to the device's memory pool, which keeps them (see keep_pool_memory) so the next step's
// allocation of the same size is a pool hit: no driver call and no device-wide
// synchronisation, unlike cudaMalloc/cudaFree every step. Work on other streams that uses the
// buffer must be finished (or ordered before `stream`) before it is reset.
template <class T>
class StreamBuffer : public detail::OwnedArray<T, detail::StreamAlloc> {
 public:
  StreamBuffer() = default;
  StreamBuffer(size_t n, cudaStream_t stream, std::string_view what = "stream-ordered buffer")
      : detail::OwnedArray<T, detail::StreamAlloc>(detail::StreamAlloc{stream}, n, what) {}
};

// Makes the device's default memory pool keep freed blocks instead of returning them to the
// driver at the next synchronisation (its default release threshold is 0), so StreamBuffers
// re-allocated every step are served from the pool.
inline void keep_pool_memory(int device) {
  cudaMemPool_t pool = nullptr;
  check_cuda(cudaDeviceGetDefaultMemPool(&pool, device), fmt::format("cudaDeviceGetDefaultMemPool({})", device));
  uint64_t keep = UINT64_MAX;
  check_cuda(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep),
             "cudaMemPoolSetAttribute(release threshold)");
}

// Page-locked host memory: the only kind a copy engine moves asynchronously.
template <class T>
class PinnedBuffer : public detail::OwnedArray<T, detail::PinnedAlloc> {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(size_t n, std::string_view what = "pinned host buffer")
      : detail::OwnedArray<T, detail::PinnedAlloc>(detail::PinnedAlloc{}, n, what) {}
};

class Stream {
 public:
  // Non-blocking: does not serialise with the legacy default stream other libraries may use.
  explicit Stream(std::string_view what = "stream") {
    check_cuda(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), fmt::format("cudaStreamCreate {}", what));
  }
  ~Stream() {
    if (s_) (void)cudaStreamDestroy(s_);
  }
  Stream(Stream&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  Stream& operator=(Stream&&) = delete;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return s_; }
  void synchronize(std::string_view op) const { check_cuda(cudaStreamSynchronize(s_), op); }

 private:
  cudaStream_t s_ = nullptr;
};

class Event {
 public:
  // Timing off by default: a timing event costs more to record and is not needed for ordering.
  explicit Event(bool timing = false) {
    check_cuda(cudaEventCreateWithFlags(&e_, timing ? cudaEventDefault : cudaEventDisableTiming), "cudaEventCreate");
  }
  ~Event() {
    if (e_) (void)cudaEventDestroy(e_);
  }
  Event(Event&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  Event& operator=(Event&&) = delete;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return e_; }
  void record(cudaStream_t s) { check_cuda(cudaEventRecord(e_, s), "cudaEventRecord"); }
  void synchronize() const { check_cuda(cudaEventSynchronize(e_), "cudaEventSynchronize"); }
  // Makes `s` wait for the work recorded before this event, without blocking the host.
  void make_wait(cudaStream_t s) const { check_cuda(cudaStreamWaitEvent(s, e_, 0), "cudaStreamWaitEvent"); }

 private:
  cudaEvent_t e_ = nullptr;
};

class CublasHandle {
 public:
  explicit CublasHandle(cudaStream_t stream) {
    check_cublas(cublasCreate(&h_), "cublasCreate");
    check_cublas(cublasSetStream(h_, stream), "cublasSetStream");
  }
  ~CublasHandle() {
    if (h_) (void)cublasDestroy(h_);
  }
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
  cublasHandle_t get() const { return h_; }

 private:
  cublasHandle_t h_ = nullptr;
};

}  // namespace geoloco::cuda

// The CUDA runtime functions geoloco calls, implemented on the host over DeviceState (the
// declarations are the toolkit's own cuda_runtime_api.h). Semantics follow the CUDA runtime
// documentation's "API synchronization behavior": pageable host -> device copies snapshot the
// source and return, device -> pageable host copies return when done, pinned copies and
// memsets are asynchronous, cudaMemset is asynchronous too, cudaFree synchronises.
#include <cuda_runtime_api.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

#include "trainer/cuda/emulator/device_state.hpp"

using geoloco::cuda::emu::DeviceState;
using geoloco::cuda::emu::last_error;
using geoloco::cuda::emu::MemKind;

namespace {

constexpr int kDeviceCount = 1;
thread_local int tl_device = 0;
CUmemPoolHandle_st* const kPool = reinterpret_cast<CUmemPoolHandle_st*>(uintptr_t{0x9e010c0});

cudaError_t ret(cudaError_t e) {
  if (e != cudaSuccess) last_error() = e;
  return e;
}

// Every call after a device fault returns the fault.
#define GEOLOCO_EMU_ENTER(d)            \
  auto& d = DeviceState::get();         \
  std::lock_guard lock_(d.mu);          \
  if (d.sticky != cudaSuccess) return ret(d.sticky)

cudaError_t invalid(const std::string& why) {
  std::fprintf(stderr, "geoloco cuda emulator: %s\n", why.c_str());
  return ret(cudaErrorInvalidValue);
}

enum class Where { Device, Pinned, Pageable, Bad };

Where classify(const DeviceState& d, const void* p, size_t extent) {
  if (const auto* a = d.find(p, extent)) return a->second == MemKind::Device ? Where::Device : Where::Pinned;
  if (const auto* a = d.find(p, 0); a && a->second == MemKind::Device) return Where::Bad;  // runs past the end
  return Where::Pageable;
}

const char* name(Where w) {
  switch (w) {
    case Where::Device:
      return "device memory";
    case Where::Pinned:
      return "pinned host memory";
    case Where::Pageable:
      return "pageable host memory";
    case Where::Bad:
      return "a range past the end of a device allocation";
  }
  return "?";
}

// A 2-D copy (a 1-D copy is one row) with the kind, synchronisation and snapshot rules above.
cudaError_t copy(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                 cudaMemcpyKind kind, cudaStream_t stream, bool sync, const char* api) {
  GEOLOCO_EMU_ENTER(d);
  if (!d.valid(stream)) return ret(cudaErrorInvalidResourceHandle);
  if (width == 0 || height == 0) return cudaSuccess;
  if (height > 1 && (dpitch < width || spitch < width))
    return invalid(fmt::format("{}: pitch below the row width", api));
  const size_t dext = dpitch * (height - 1) + width, sext = spitch * (height - 1) + width;
  const Where dw = classify(d, dst, dext), sw = classify(d, src, sext);
  if (dw == Where::Bad || sw == Where::Bad)
    return invalid(fmt::format("{}: {} bytes from {} to {} run past the end of a device allocation", api, sext, src,
                               dst));
  const bool dd = dw == Where::Device, sd = sw == Where::Device;
  bool ok = true;
  switch (kind) {
    case cudaMemcpyHostToDevice:
      ok = !sd && dd;
      break;
    case cudaMemcpyDeviceToHost:
      ok = sd && !dd;
      break;
    case cudaMemcpyDeviceToDevice:
      ok = sd && dd;
      break;
    case cudaMemcpyHostToHost:
      ok = !sd && !dd;
      break;
    case cudaMemcpyDefault:
      break;
    default:
      ok = false;
  }
  if (!ok)
    return invalid(fmt::format("{}: kind {} does not match the pointers (source in {}, destination in {})", api,
                               int(kind), name(sw), name(dw)));
  std::shared_ptr<std::vector<char>> snapshot;
  const char* from = static_cast<const char*>(src);
  if (!sync && sw == Where::Pageable) {  // the caller may reuse its buffer as soon as we return
    snapshot = std::make_shared<std::vector<char>>(from, from + sext);
    from = snapshot->data();
  }
  char* to = static_cast<char*>(dst);
  auto* s = sync ? &d.legacy : d.resolve(stream);
  const uint64_t seq = d.enqueue(s, api, [to, dpitch, from, spitch, width, height, snapshot] {
    for (size_t r = 0; r < height; ++r) std::memcpy(to + r * dpitch, from + r * spitch, width);
  });
  if (sync || dw == Where::Pageable) d.drain(s, seq);
  return ret(d.sticky);
}

cudaError_t memset_on(void* p, int value, size_t count, cudaStream_t stream, bool legacy, const char* api) {
  GEOLOCO_EMU_ENTER(d);
  if (!d.valid(stream)) return ret(cudaErrorInvalidResourceHandle);
  if (count == 0) return cudaSuccess;
  if (!d.is_device(p, count))
    return invalid(fmt::format("{}: {} bytes at {} are not inside one device allocation", api, count, p));
  d.enqueue(legacy ? &d.legacy : d.resolve(stream), api,
            [p, value, count] { std::memset(p, value, count); });
  return cudaSuccess;
}

}  // namespace

extern "C" {

cudaError_t cudaGetDeviceCount(int* count) {
  if (!count) return ret(cudaErrorInvalidValue);
  *count = kDeviceCount;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= kDeviceCount) return ret(cudaErrorInvalidDevice);
  tl_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (!device) return ret(cudaErrorInvalidValue);
  *device = tl_device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int device) {
  if (!p) return ret(cudaErrorInvalidValue);
  if (device < 0 || device >= kDeviceCount) return ret(cudaErrorInvalidDevice);
  auto& d = DeviceState::get();
  *p = cudaDeviceProp{};
  std::snprintf(p->name, sizeof p->name, "geoloco CUDA emulator (host)");
  p->major = 9;
  p->minor = 0;
  p->totalGlobalMem = d.capacity;
  p->multiProcessorCount = 1;
  p->warpSize = 32;
  p->maxThreadsPerBlock = 1024;
  p->maxThreadsDim[0] = 1024;
  p->maxThreadsDim[1] = 1024;
  p->maxThreadsDim[2] = 64;
  p->maxGridSize[0] = 0x7fffffff;
  p->maxGridSize[1] = 65535;
  p->maxGridSize[2] = 65535;
  p->sharedMemPerBlock = 48 * 1024;
  p->regsPerBlock = 65536;
  p->unifiedAddressing = 1;
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
  GEOLOCO_EMU_ENTER(d);
  d.drain_all();
  return ret(d.sticky);
}

cudaError_t cudaGetLastError(void) {
  auto& d = DeviceState::get();
  std::lock_guard lock(d.mu);
  const cudaError_t e = d.sticky != cudaSuccess ? d.sticky : last_error();
  last_error() = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError(void) {
  auto& d = DeviceState::get();
  std::lock_guard lock(d.mu);
  return d.sticky != cudaSuccess ? d.sticky : last_error();
}

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle:
      return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady:
      return "cudaErrorNotReady";
    case cudaErrorIllegalAddress:
      return "cudaErrorIllegalAddress";
    case cudaErrorLaunchFailure:
      return "cudaErrorLaunchFailure";
    case cudaErrorNoDevice:
      return "cudaErrorNoDevice";
    default:
      return "cudaErrorUnknown";
  }
}

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle:
      return "invalid resource handle";
    case cudaErrorNotReady:
      return "device not ready";
    case cudaErrorIllegalAddress:
      return "an illegal memory access was encountered";
    case cudaErrorLaunchFailure:
      return "unspecified launch failure";
    default:
      return "unknown error";
  }
}

cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  GEOLOCO_EMU_ENTER(d);
  if (!free || !total) return ret(cudaErrorInvalidValue);
  *total = d.capacity;
  *free = d.capacity - d.used;
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** p, size_t bytes) {
  GEOLOCO_EMU_ENTER(d);
  if (!p) return ret(cudaErrorInvalidValue);
  *p = d.allocate(bytes, MemKind::Device);
  return *p ? cudaSuccess : ret(cudaErrorMemoryAllocation);
}

cudaError_t cudaFree(void* p) {
  GEOLOCO_EMU_ENTER(d);
  if (!p) return cudaSuccess;
  if (!d.is_device(p, 0)) return invalid(fmt::format("cudaFree({}): not a device allocation", p));
  d.drain_all();  // cudaFree synchronises the device
  d.release(p);
  return ret(d.sticky);
}

cudaError_t cudaMallocAsync(void** p, size_t bytes, cudaStream_t stream) {
  GEOLOCO_EMU_ENTER(d);
  if (!p) return ret(cudaErrorInvalidValue);
  if (!d.valid(stream)) return ret(cudaErrorInvalidResourceHandle);
  *p = d.allocate(bytes, MemKind::Device);
  return *p ? cudaSuccess : ret(cudaErrorMemoryAllocation);
}

cudaError_t cudaFreeAsync(void* p, cudaStream_t stream) {
  GEOLOCO_EMU_ENTER(d);
  if (!p) return cudaSuccess;
  if (!d.valid(stream)) return ret(cudaErrorInvalidResourceHandle);
  if (!d.is_device(p, 0)) return invalid(fmt::format("cudaFreeAsync({}): not a device allocation", p));
  auto* dev = &d;
  d.enqueue(d.resolve(stream), "cudaFreeAsync", [dev, p] { dev->release(p); });
  return cudaSuccess;
}

cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t* pool, int device) {
  if (!pool) return ret(cudaErrorInvalidValue);
  if (device < 0 || device >= kDeviceCount) return ret(cudaErrorInvalidDevice);
  *pool = kPool;
  return cudaSuccess;
}

cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, cudaMemPoolAttr, void* value) {
  if (pool != kPool || !value) return ret(cudaErrorInvalidValue);
  return cudaSuccess;  // the emulator's allocator has no pool to tune
}

cudaError_t cudaMallocHost(void** p, size_t bytes) {
  GEOLOCO_EMU_ENTER(d);
  if (!p) return ret(cudaErrorInvalidValue);
  *p = d.allocate(bytes, MemKind::Pinned);
  return *p ? cudaSuccess : ret(cudaErrorMemoryAllocation);
}

cudaError_t cudaFreeHost(void* p) {
  GEOLOCO_EMU_ENTER(d);
  if (!p) return cudaSuccess;
  if (!d.is_pinned(p, 0)) return invalid(fmt::format("cudaFreeHost({}): not a pinned allocation", p));
  d.drain_all();
  d.release(p);
  return ret(d.sticky);
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  return copy(dst, count, src, count, count, 1, kind, nullptr, true, "cudaMemcpy");
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind, cudaStream_t stream) {
  return copy(dst, count, src, count, count, 1, kind, stream, false, "cudaMemcpyAsync");
}

cudaError_t cudaMemcpy2D(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                         cudaMemcpyKind kind) {
  return copy(dst, dpitch, src, spitch, width, height, kind, nullptr, true, "cudaMemcpy2D");
}

cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                              cudaMemcpyKind kind, cudaStream_t stream) {
  return copy(dst, dpitch, src, spitch, width, height, kind, stream, false, "cudaMemcpy2DAsync");
}

cudaError_t cudaMemset(void* p, int value, size_t count) {
  return memset_on(p, value, count, nullptr, true, "cudaMemset");
}

cudaError_t cudaMemsetAsync(void* p, int value, size_t count, cudaStream_t stream) {
  return memset_on(p, value, count, stream, false, "cudaMemsetAsync");
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags) {
  GEOLOCO_EMU_ENTER(d);
  if (!s || (flags & ~unsigned(cudaStreamNonBlocking))) return ret(cudaErrorInvalidValue);
  auto* st = new CUstream_st();
  st->blocking = !(flags & cudaStreamNonBlocking);
  d.streams.insert(st);
  *s = st;
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }

cudaError_t cudaStreamDestroy(cudaStream_t s) {
  auto& d = DeviceState::get();
  std::lock_guard lock(d.mu);
  if (!s || !d.streams.count(s)) return ret(cudaErrorInvalidResourceHandle);
  d.drain(s);  // pending work still completes
  d.streams.erase(s);
  delete s;
  return ret(d.sticky);
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  GEOLOCO_EMU_ENTER(d);
  if (!d.valid(s)) return ret(cudaErrorInvalidResourceHandle);
  d.drain(d.resolve(s));
  return ret(d.sticky);
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags) {
  GEOLOCO_EMU_ENTER(d);
  if (!d.valid(s) || !e) return ret(cudaErrorInvalidResourceHandle);
  if (flags != 0) return ret(cudaErrorInvalidValue);
  if (!e->recorded || !e->seq) return cudaSuccess;  // nothing to wait for
  d.enqueue(d.resolve(s), "cudaStreamWaitEvent", [] {}, {{e->stream, e->seq}});
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int flags) {
  GEOLOCO_EMU_ENTER(d);
  if (!e || (flags & ~unsigned(cudaEventDisableTiming | cudaEventBlockingSync))) return ret(cudaErrorInvalidValue);
  *e = new CUevent_st();
  (*e)->timing = (flags & cudaEventDisableTiming) == 0;
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }

cudaError_t cudaEventDestroy(cudaEvent_t e) {
  if (!e) return ret(cudaErrorInvalidResourceHandle);
  delete e;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  GEOLOCO_EMU_ENTER(d);
  if (!e || !d.valid(s)) return ret(cudaErrorInvalidResourceHandle);
  e->stream = d.resolve(s);
  e->recorded = true;
  if (!e->timing) {
    e->seq = e->stream->last;  // ordering only: the work enqueued so far
    return cudaSuccess;
  }
  auto stamp = std::make_shared<double>(std::nan(""));
  e->stamp_ms = stamp;
  e->seq = d.enqueue(e->stream, "cudaEventRecord", [stamp] {
    *stamp = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
  });
  return cudaSuccess;
}

// Host time between the two stamps: meaningless as GPU time, but the call's contract holds
// (both recorded with timing, both completed: cudaErrorNotReady before a synchronisation).
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  GEOLOCO_EMU_ENTER(d);
  if (!ms) return ret(cudaErrorInvalidValue);
  if (!start || !end || !start->timing || !end->timing || !start->recorded || !end->recorded)
    return ret(cudaErrorInvalidResourceHandle);
  // Not an error state (as cudaEventQuery's): cudaGetLastError is not set.
  if (std::isnan(*start->stamp_ms) || std::isnan(*end->stamp_ms)) return cudaErrorNotReady;
  *ms = static_cast<float>(*end->stamp_ms - *start->stamp_ms);
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  GEOLOCO_EMU_ENTER(d);
  if (!e) return ret(cudaErrorInvalidResourceHandle);
  if (e->recorded && e->seq) d.drain(e->stream, e->seq);
  return ret(d.sticky);
}

// The emulated device finishes the event's work when asked about it.
cudaError_t cudaEventQuery(cudaEvent_t e) { return cudaEventSynchronize(e); }

}  // extern "C"

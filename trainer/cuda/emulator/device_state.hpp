// The emulated device: its memory, its streams and events, and the deferred execution that
// gives them CUDA's ordering. Internal to the emulator (runtime_api.cpp, cublas_api.cpp).
//
// Work is never done at the call that enqueues it: each stream keeps a queue, and the queue
// runs only when the host has to wait for it (stream/event/device synchronisation, a
// synchronous copy, cudaFree). So host code that reads a result without the synchronisation
// CUDA requires sees the buffer's old contents (new allocations are filled with 0xff bytes:
// NaN floats, -1 integers), and a stream that forgets to wait for another's event runs
// before it. Cross-stream dependencies are explicit (cudaStreamWaitEvent), plus the legacy
// default stream's implicit ordering with blocking streams.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

struct CUstream_st;

namespace geoloco::cuda::emu {

enum class MemKind { Device, Pinned };

struct Dep {
  CUstream_st* stream;
  uint64_t seq;
};

struct Op {
  uint64_t seq;
  std::string what;
  std::function<void()> fn;
  std::vector<Dep> deps;
};

}  // namespace geoloco::cuda::emu

struct CUstream_st {
  std::deque<geoloco::cuda::emu::Op> queue;
  uint64_t last = 0;  // seq of the last op enqueued (0: none)
  bool blocking = true;
  bool legacy = false;
};

struct CUevent_st {
  CUstream_st* stream = nullptr;
  uint64_t seq = 0;
  bool recorded = false;
  bool timing = true;  // created without cudaEventDisableTiming
  // A timing event's record is an op that stamps the host clock (ms) when the stream reaches
  // it: NaN until then. Shared with that op, so destroying a pending event is safe, and each
  // record gets its own stamp (a re-record does not inherit the old one's).
  std::shared_ptr<double> stamp_ms;
};

namespace geoloco::cuda::emu {

class DeviceState {
 public:
  static DeviceState& get();

  std::recursive_mutex mu;

  // The first failure of enqueued work makes the context unusable, as on a GPU: every later
  // call returns this error (cudaErrorIllegalAddress or cudaErrorLaunchFailure).
  cudaError_t sticky = cudaSuccess;
  std::string failure;

  // memory
  size_t capacity;
  size_t used = 0;
  std::map<uintptr_t, std::pair<size_t, MemKind>> allocs;
  void* allocate(size_t bytes, MemKind kind);  // nullptr when the capacity would be exceeded
  void release(void* p);
  // The allocation holding [p, p + bytes) (p strictly inside it, even for bytes 0), or nullptr.
  const std::pair<size_t, MemKind>* find(const void* p, size_t bytes) const;
  bool is_device(const void* p, size_t bytes) const;
  bool is_pinned(const void* p, size_t bytes) const;

  // streams
  CUstream_st legacy;
  std::set<CUstream_st*> streams;
  uint64_t seq = 0;
  CUstream_st* resolve(cudaStream_t s) { return s ? s : &legacy; }
  bool valid(cudaStream_t s) const { return !s || streams.count(s) > 0; }
  uint64_t enqueue(CUstream_st* s, std::string what, std::function<void()> fn, std::vector<Dep> deps = {});
  // Runs s's ops up to seq (and, first, what each depends on). On a failure: sticky error.
  void drain(CUstream_st* s, uint64_t upto = UINT64_MAX);
  void drain_all();

  // Clears the sticky error and every queue (tests of the emulator only).
  void reset();

 private:
  DeviceState();
  void fail(cudaError_t e, const std::string& why);
};

// The per-thread error cudaGetLastError returns and clears.
cudaError_t& last_error();

// The message of the failure that made the context unusable ("" while it is usable).
std::string failure_message();
// Test hook: clears a sticky failure and all pending work.
void reset_for_tests();

}  // namespace geoloco::cuda::emu

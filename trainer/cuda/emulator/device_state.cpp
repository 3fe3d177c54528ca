#include "trainer/cuda/emulator/device_state.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <stdexcept>

#include <fmt/format.h>

#include "trainer/cuda/emulator/scheduler.hpp"

namespace geoloco::cuda::emu {
namespace {

constexpr size_t kAlign = 256;  // cudaMalloc's alignment
constexpr size_t kDefaultCapacity = size_t(16) << 30;

size_t capacity_from_env() {
  if (const char* v = std::getenv("GEOLOCO_CUDA_EMULATOR_MEMORY")) {
    char* end = nullptr;
    const unsigned long long n = std::strtoull(v, &end, 10);
    if (end && *end == '\0' && n > 0) return size_t(n);
    std::fprintf(stderr, "geoloco cuda emulator: GEOLOCO_CUDA_EMULATOR_MEMORY=%s is not a byte count, using %zu\n",
                 v, kDefaultCapacity);
  }
  return kDefaultCapacity;
}

}  // namespace

cudaError_t& last_error() {
  static thread_local cudaError_t e = cudaSuccess;
  return e;
}

DeviceState& DeviceState::get() {
  static DeviceState* d = new DeviceState();  // never destroyed: handles may outlive statics
  return *d;
}

DeviceState::DeviceState() : capacity(capacity_from_env()) { legacy.legacy = true; }

void* DeviceState::allocate(size_t bytes, MemKind kind) {
  const size_t rounded = (std::max<size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign;
  if (kind == MemKind::Device && (rounded > capacity || used > capacity - rounded)) return nullptr;
  void* p = std::aligned_alloc(kAlign, rounded);
  if (!p) return nullptr;
  std::memset(p, 0xff, rounded);  // uninitialised device memory: NaN floats, -1 integers
  allocs[reinterpret_cast<uintptr_t>(p)] = {bytes, kind};
  if (kind == MemKind::Device) used += rounded;
  return p;
}

void DeviceState::release(void* p) {
  const auto it = allocs.find(reinterpret_cast<uintptr_t>(p));
  if (it == allocs.end()) return;
  if (it->second.second == MemKind::Device)
    used -= (std::max<size_t>(it->second.first, 1) + kAlign - 1) / kAlign * kAlign;
  allocs.erase(it);
  std::free(p);
}

const std::pair<size_t, MemKind>* DeviceState::find(const void* p, size_t bytes) const {
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = allocs.upper_bound(a);
  if (it == allocs.begin()) return nullptr;
  --it;
  // Strictly inside (a host buffer can start exactly where a device allocation ends).
  const size_t off = a - it->first, size = it->second.first;
  if (a < it->first || off >= size || bytes > size - off) return nullptr;
  return &it->second;
}

bool DeviceState::is_device(const void* p, size_t bytes) const {
  const auto* a = find(p, bytes);
  return a && a->second == MemKind::Device;
}
bool DeviceState::is_pinned(const void* p, size_t bytes) const {
  const auto* a = find(p, bytes);
  return a && a->second == MemKind::Pinned;
}

uint64_t DeviceState::enqueue(CUstream_st* s, std::string what, std::function<void()> fn, std::vector<Dep> deps) {
  // The legacy default stream waits for every blocking stream, and they wait for it.
  if (s->legacy) {
    for (CUstream_st* o : streams)
      if (o->blocking && o->last) deps.push_back({o, o->last});
  } else if (s->blocking && legacy.last) {
    deps.push_back({&legacy, legacy.last});
  }
  const uint64_t n = ++seq;
  s->queue.push_back(Op{n, std::move(what), std::move(fn), std::move(deps)});
  s->last = n;
  return n;
}

void DeviceState::drain(CUstream_st* s, uint64_t upto) {
  while (sticky == cudaSuccess && !s->queue.empty() && s->queue.front().seq <= upto) {
    Op op = std::move(s->queue.front());
    s->queue.pop_front();
    for (const Dep& d : op.deps) drain(d.stream, d.seq);
    if (sticky != cudaSuccess) return;
    try {
      op.fn();
    } catch (const EmulationError& e) {
      fail(cudaErrorLaunchFailure, e.what());
    } catch (const std::exception& e) {
      fail(cudaErrorIllegalAddress, fmt::format("{}: {}", op.what, e.what()));
    }
  }
}

void DeviceState::drain_all() {
  drain(&legacy);
  for (CUstream_st* s : streams) drain(s);
}

void DeviceState::fail(cudaError_t e, const std::string& why) {
  sticky = e;
  failure = why;
  std::fprintf(stderr, "geoloco cuda emulator: %s (the context is now unusable, as after a device fault)\n",
               why.c_str());
  legacy.queue.clear();
  for (CUstream_st* s : streams) s->queue.clear();
}

void DeviceState::reset() {
  sticky = cudaSuccess;
  failure.clear();
  legacy.queue.clear();
  for (CUstream_st* s : streams) s->queue.clear();
}

std::string failure_message() {
  auto& d = DeviceState::get();
  std::lock_guard lock(d.mu);
  return d.failure;
}

void reset_for_tests() {
  auto& d = DeviceState::get();
  std::lock_guard lock(d.mu);
  d.reset();
  last_error() = cudaSuccess;
}

void launch_kernel(KernelLaunch l) {
  auto& d = DeviceState::get();
  std::lock_guard lock(d.mu);
  if (d.sticky != cudaSuccess) {
    last_error() = d.sticky;
    return;
  }
  const uint64_t threads = uint64_t(l.block.x) * l.block.y * l.block.z;
  const bool bad = threads == 0 || threads > 1024 || l.block.x > 1024 || l.block.y > 1024 || l.block.z > 64 ||
                   l.grid.x == 0 || l.grid.x > 0x7fffffffu || l.grid.y == 0 || l.grid.y > 65535 || l.grid.z == 0 ||
                   l.grid.z > 65535 || l.shmem > 48 * 1024;
  if (bad) {
    std::fprintf(stderr,
                 "geoloco cuda emulator: kernel %s launched with grid (%u,%u,%u) block (%u,%u,%u) shared %zu: "
                 "invalid configuration\n",
                 l.name, l.grid.x, l.grid.y, l.grid.z, l.block.x, l.block.y, l.block.z, l.shmem);
    last_error() = cudaErrorInvalidConfiguration;
    return;
  }
  if (!d.valid(l.stream)) {
    last_error() = cudaErrorInvalidResourceHandle;
    return;
  }
  auto launch = std::make_shared<KernelLaunch>(std::move(l));
  d.enqueue(d.resolve(launch->stream), launch->name, [launch, &d] {
    for (const PointerArg& p : launch->pointers)
      if (p.ptr && !d.find(p.ptr, 0))
        throw std::runtime_error(fmt::format("argument {} ({}) is not device memory (host memory, freed, or never "
                                             "allocated): on a GPU this is an illegal address",
                                             p.index, p.ptr));
    run_grid(*launch);
  });
}

}  // namespace geoloco::cuda::emu

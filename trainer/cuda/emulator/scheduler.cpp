#include "trainer/cuda/emulator/scheduler.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <numeric>
#include <random>
#include <span>

#include <fmt/format.h>

#include "trainer/cuda/emulator/fiber_context.hpp"

namespace geoloco::cuda::emu {
namespace {

constexpr size_t kStackBytes = 256 * 1024;  // kernel frames are small; sanitizers enlarge them
constexpr size_t kGuardBytes = 4096;

// One fiber stack with a guard page below it (an overflow faults instead of corrupting).
class FiberStack {
 public:
  FiberStack() {
    base_ = mmap(nullptr, kStackBytes + kGuardBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
    if (base_ == MAP_FAILED) throw EmulationError("cuda emulator: cannot map a fiber stack");
    mprotect(base_, kGuardBytes, PROT_NONE);
  }
  ~FiberStack() { munmap(base_, kStackBytes + kGuardBytes); }
  FiberStack(const FiberStack&) = delete;
  FiberStack& operator=(const FiberStack&) = delete;
  void* bottom() const { return static_cast<char*>(base_) + kGuardBytes; }

 private:
  void* base_;
};

enum class Wait { None, Barrier, Shuffle };

struct Fiber {
  FiberContext ctx;
  uint3 tid;
  int linear = 0;
  bool done = false;
  Wait wait = Wait::None;
  uint64_t wait_gen = 0;
};

struct Warp {
  uint64_t gen = 0;
  int count = 0;
  uint32_t exists = 0;  // lanes that exist (a partial last warp has fewer)
  uint32_t exited = 0;
  uint32_t pending_mask = 0;  // the mask of the shuffle lanes are waiting at (count > 0)
  uint32_t slots[2][32] = {};
};

struct Block {
  const KernelLaunch* launch = nullptr;
  uint3 bid{};
  std::unique_ptr<Fiber[]> fiber_store;  // contexts are not movable
  std::span<Fiber> fibers;
  std::vector<Warp> warps;
  FiberContext sched;
  uint64_t bar_gen = 0;
  int bar_count = 0, done_count = 0;
  bool used_sync = false;
  std::exception_ptr error;
};

thread_local std::vector<std::unique_ptr<FiberStack>> tl_stacks;
thread_local Block* tl_block = nullptr;  // null: the thread runs as a plain call
thread_local Fiber* tl_fiber = nullptr;
thread_local const KernelLaunch* tl_launch = nullptr;
std::atomic<uint64_t> g_fiber_blocks{0}, g_direct_blocks{0};

// The order fibers are resumed in. Shuffled (the default) varies it every sweep, so a read of
// shared memory another warp writes without a barrier in between sees the old value in some
// sweeps instead of always happening to run after the write.
struct ScheduleState {
  std::atomic<bool> shuffled;
  std::atomic<uint64_t> seed;
  std::atomic<uint64_t> epoch{0};  // bumped by set_schedule: every thread reseeds
};
ScheduleState& schedule_state() {
  static ScheduleState s;
  static const bool from_env = [] {
    const char* mode = std::getenv("GEOLOCO_CUDA_EMULATOR_SCHEDULE");
    s.shuffled = !(mode && std::strcmp(mode, "ordered") == 0);
    const char* seed = std::getenv("GEOLOCO_CUDA_EMULATOR_SEED");
    s.seed = seed ? std::strtoull(seed, nullptr, 10) : 1;
    return true;
  }();
  (void)from_env;
  return s;
}
thread_local std::mt19937_64 tl_rng;
thread_local uint64_t tl_rng_epoch = UINT64_MAX;

std::string where(const KernelLaunch& l, uint3 b) {
  return fmt::format("kernel {} block ({},{},{}) thread ({},{},{})", l.name, b.x, b.y, b.z, tl_kernel.thread_idx.x,
                     tl_kernel.thread_idx.y, tl_kernel.thread_idx.z);
}

void release_barrier_if_complete(Block& b) {
  if (b.bar_count > 0 && b.bar_count + b.done_count == int(b.fibers.size())) {
    ++b.bar_gen;
    b.bar_count = 0;
  }
}

void yield(Block& b, Fiber& f) { FiberContext::switch_to(f.ctx, b.sched); }

void trampoline() {
  Block& b = *tl_block;
  Fiber& f = *tl_fiber;
  FiberContext::started(b.sched);
  try {
    b.launch->body();
  } catch (...) {
    if (!b.error) b.error = std::current_exception();
  }
  f.done = true;
  ++b.done_count;
  Warp& w = b.warps[size_t(f.linear / 32)];
  const int lane = f.linear % 32;
  w.exited |= 1u << lane;
  if (w.count > 0 && (w.pending_mask >> lane & 1u) && !b.error) {
    uint32_t waiting = 0;
    for (int i = 0; i < 32; ++i) {
      const size_t at = size_t(f.linear / 32 * 32 + i);
      if (at < b.fibers.size() && b.fibers[at].wait == Wait::Shuffle) waiting |= 1u << i;
    }
    b.error = std::make_exception_ptr(EmulationError(fmt::format(
        "{}: lane {} exited while lanes {:#010x} wait at __shfl_xor_sync(mask {:#010x}) naming it",
        where(*b.launch, b.bid), lane, waiting, w.pending_mask)));
  }
  release_barrier_if_complete(b);
  FiberContext::exit_to(f.ctx, b.sched);
}

bool ready(const Block& b, const Fiber& f) {
  switch (f.wait) {
    case Wait::None:
      return true;
    case Wait::Barrier:
      return b.bar_gen > f.wait_gen;
    case Wait::Shuffle:
      return b.warps[size_t(f.linear / 32)].gen > f.wait_gen;
  }
  return false;
}

[[noreturn]] void deadlock(const Block& b) {
  int at_barrier = 0, at_shuffle = 0, exited = 0;
  for (const auto& f : b.fibers) {
    if (f.done)
      ++exited;
    else if (f.wait == Wait::Barrier)
      ++at_barrier;
    else if (f.wait == Wait::Shuffle)
      ++at_shuffle;
  }
  throw EmulationError(fmt::format(
      "kernel {} block ({},{},{}): deadlock: {} threads wait at __syncthreads, {} at a warp shuffle, {} exited, "
      "and none can proceed (a barrier or shuffle that not every thread of the block/warp reaches)",
      b.launch->name, b.bid.x, b.bid.y, b.bid.z, at_barrier, at_shuffle, exited));
}

// Returns whether the block synchronised (barrier or shuffle).
bool run_block_fibers(const KernelLaunch& l, uint3 bid, size_t nthreads) {
  while (tl_stacks.size() < nthreads) tl_stacks.push_back(std::make_unique<FiberStack>());
  Block b;
  b.launch = &l;
  b.bid = bid;
  b.fiber_store = std::make_unique<Fiber[]>(nthreads);
  b.fibers = std::span<Fiber>(b.fiber_store.get(), nthreads);
  b.warps.resize((nthreads + 31) / 32);
  for (size_t i = 0; i < nthreads; ++i) b.warps[i / 32].exists |= 1u << (i % 32);
  size_t i = 0;
  for (unsigned z = 0; z < l.block.z; ++z)
    for (unsigned y = 0; y < l.block.y; ++y)
      for (unsigned x = 0; x < l.block.x; ++x, ++i) {
        Fiber& f = b.fibers[i];
        f.tid = {x, y, z};
        f.linear = int(i);
        f.ctx.init(tl_stacks[i]->bottom(), kStackBytes, trampoline);
      }
  Block* outer_block = tl_block;
  Fiber* outer_fiber = tl_fiber;
  tl_block = &b;
  auto& sched = schedule_state();
  const bool shuffled = sched.shuffled.load();
  if (shuffled && tl_rng_epoch != sched.epoch.load()) {
    tl_rng.seed(sched.seed.load());
    tl_rng_epoch = sched.epoch.load();
  }
  std::vector<uint32_t> order(nthreads);
  std::iota(order.begin(), order.end(), 0u);
  for (;;) {
    bool progress = false, all_done = true;
    if (shuffled) std::shuffle(order.begin(), order.end(), tl_rng);
    for (uint32_t at : order) {
      Fiber& f = b.fibers[at];
      if (f.done) continue;
      all_done = false;
      if (!ready(b, f)) continue;
      progress = true;
      tl_fiber = &f;
      tl_kernel.thread_idx = f.tid;
      FiberContext::switch_to(b.sched, f.ctx);
      if (b.error) break;
    }
    if (b.error || all_done) break;
    if (!progress) {
      tl_block = outer_block;
      tl_fiber = outer_fiber;
      deadlock(b);
    }
  }
  tl_block = outer_block;
  tl_fiber = outer_fiber;
  // Fibers abandoned after an error hold only trivially destructible kernel locals.
  if (b.error) std::rethrow_exception(b.error);
  ++g_fiber_blocks;
  return b.used_sync;
}

}  // namespace

void syncthreads() {
  Block* b = tl_block;
  if (!b)
    throw EmulationError(fmt::format("{}: __syncthreads in a block that runs as plain calls (block 0 of this "
                                     "launch never synchronised, so the emulator did not give it fibers)",
                                     tl_launch ? where(*tl_launch, tl_kernel.block_idx) : std::string("kernel")));
  Fiber& f = *tl_fiber;
  b->used_sync = true;
  const uint64_t gen = b->bar_gen;
  ++b->bar_count;
  release_barrier_if_complete(*b);
  if (b->bar_gen > gen) return;
  f.wait = Wait::Barrier;
  f.wait_gen = gen;
  yield(*b, f);
  f.wait = Wait::None;
}

uint32_t shfl_xor_bits(uint32_t mask, uint32_t bits, int lane_mask, int width) {
  Block* b = tl_block;
  if (!b)
    throw EmulationError(fmt::format("{}: warp shuffle in a block that runs as plain calls (block 0 of this launch "
                                     "never synchronised, so the emulator did not give it fibers)",
                                     tl_launch ? where(*tl_launch, tl_kernel.block_idx) : std::string("kernel")));
  Fiber& f = *tl_fiber;
  b->used_sync = true;
  const int lane = f.linear % 32;
  Warp& w = b->warps[size_t(f.linear / 32)];
  const auto fail = [&](const std::string& what) {
    throw EmulationError(fmt::format("{}: __shfl_xor_sync(mask {:#010x}): {}", where(*b->launch, b->bid), mask, what));
  };
  if (width < 1 || width > 32 || !std::has_single_bit(unsigned(width))) fail(fmt::format("width {} is invalid", width));
  if (!(mask >> lane & 1u)) fail("the calling lane is not in the mask");
  if (mask & ~w.exists) fail(fmt::format("the mask names lanes {:#010x} that do not exist", mask & ~w.exists));
  if (mask & w.exited) fail(fmt::format("the mask names lanes {:#010x} that have exited", mask & w.exited));
  int src = lane ^ lane_mask;
  if ((src & ~(width - 1)) != (lane & ~(width - 1))) src = lane;
  if (!(mask >> src & 1u)) fail(fmt::format("source lane {} is not in the mask", src));
  const uint64_t gen = w.gen;
  if (w.count == 0) w.pending_mask = mask;
  w.slots[gen & 1][lane] = bits;
  if (++w.count == std::popcount(mask)) {
    ++w.gen;
    w.count = 0;
  } else {
    f.wait = Wait::Shuffle;
    f.wait_gen = gen;
    yield(*b, f);
    f.wait = Wait::None;
  }
  return w.slots[gen & 1][src];
}

void run_grid(const KernelLaunch& l) {
  const size_t nthreads = size_t(l.block.x) * l.block.y * l.block.z;
  tl_kernel.block_dim = l.block;
  tl_kernel.grid_dim = l.grid;
  bool fibers = true;
  for (unsigned bz = 0; bz < l.grid.z; ++bz)
    for (unsigned by = 0; by < l.grid.y; ++by)
      for (unsigned bx = 0; bx < l.grid.x; ++bx) {
        const uint3 bid{bx, by, bz};
        tl_kernel.block_idx = bid;
        tl_launch = &l;
        if (fibers) {
          fibers = run_block_fibers(l, bid, nthreads);
          continue;
        }
        for (unsigned z = 0; z < l.block.z; ++z)
          for (unsigned y = 0; y < l.block.y; ++y)
            for (unsigned x = 0; x < l.block.x; ++x) {
              tl_kernel.thread_idx = {x, y, z};
              l.body();
            }
        ++g_direct_blocks;
      }
  tl_launch = nullptr;
}

}  // namespace geoloco::cuda::emu

namespace nvcuda::wmma::detail {
void check_pointer(const void* p, unsigned ldm, size_t elem, const char* what) {
  using namespace geoloco::cuda::emu;
  if (reinterpret_cast<uintptr_t>(p) % 32 != 0 || (size_t(ldm) * elem) % 16 != 0)
    throw EmulationError(fmt::format("{}: wmma::{}({}, ldm {}): the pointer must be 32-byte aligned and ldm a "
                                     "multiple of 16 bytes",
                                     tl_launch ? where(*tl_launch, tl_kernel.block_idx) : std::string("kernel"), what,
                                     p, ldm));
}
}  // namespace nvcuda::wmma::detail

namespace geoloco::cuda::emu {

void set_schedule(bool shuffled, uint64_t seed) {
  auto& s = schedule_state();
  s.shuffled = shuffled;
  s.seed = seed;
  ++s.epoch;
}

SchedulerCounts scheduler_counts() { return {g_fiber_blocks.load(), g_direct_blocks.load()}; }

}  // namespace geoloco::cuda::emu

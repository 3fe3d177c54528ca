#include "trainer/parallel/nccl_collective.hpp"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <exception>
#include <thread>

#include "core/log.hpp"
#include "trainer/parallel/errors.hpp"
#include "trainer/parallel/gpu.hpp"
#include "core/net.hpp"

namespace geoloco::parallel {
namespace {

using Clock = std::chrono::steady_clock;

// RAII for the three CUDA/NCCL handles we own.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  // Grows (never shrinks) to at least `bytes`; returns "" or the CUDA error text.
  std::string reserve(size_t bytes) {
    if (bytes <= size_) return "";
    if (ptr_ != nullptr) cudaFree(ptr_);
    ptr_ = nullptr;
    size_ = 0;
    cudaError_t e = cudaMalloc(&ptr_, bytes);
    if (e != cudaSuccess) return fmt::format("cudaMalloc({} bytes): {}", bytes, cudaGetErrorString(e));
    size_ = bytes;
    return "";
  }
  void* get() const { return ptr_; }

 private:
  void* ptr_ = nullptr;
  size_t size_ = 0;
};

class Stream {
 public:
  Stream() = default;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream() {
    if (s_ != nullptr) cudaStreamDestroy(s_);
  }
  cudaStream_t* out() { return &s_; }
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

class Comm {
 public:
  Comm() = default;
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;
  ~Comm() { close(); }
  ncclComm_t* out() { return &c_; }
  ncclComm_t get() const { return c_; }
  void mark_broken() { broken_ = true; }
  void close() {
    if (c_ == nullptr) return;
    // A broken communicator may have kernels stuck waiting for a dead peer: abort, never destroy.
    if (broken_) {
      ncclCommAbort(c_);
    } else {
      ncclCommDestroy(c_);
    }
    c_ = nullptr;
  }

 private:
  ncclComm_t c_ = nullptr;
  bool broken_ = false;
};

ncclDataType_t nccl_type(float*) { return ncclFloat32; }
ncclDataType_t nccl_type(double*) { return ncclFloat64; }
ncclDataType_t nccl_type(uint64_t*) { return ncclUint64; }

class NcclCollective final : public Collective {
 public:
  explicit NcclCollective(const RendezvousOptions& opts);
  // A subgroup of `parent` (split()): a communicator of its own, its unique id passed through
  // the parent's store under the split's own key.
  NcclCollective(const NcclCollective& parent, const SplitMembers& m, int color, const std::string& label);
  ~NcclCollective() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& site() const override { return rdzv_->options().site; }
  const char* backend() const override { return "nccl"; }
  MemorySpace memory() const override { return MemorySpace::kCuda; }

  void all_reduce_sum(std::span<float> d) override { all_reduce_impl(d); }
  void all_reduce_sum(std::span<double> d) override { all_reduce_impl(d); }
  void all_reduce_sum(std::span<uint64_t> d) override { all_reduce_impl(d); }
  void reduce_scatter_sum(std::span<const float> in, std::span<float> out) override;
  void all_gather(std::span<const float> my_shard, std::span<float> out) override;
  void broadcast(std::span<float> data, int root) override;
  void barrier() override;
  std::vector<std::vector<std::byte>> all_gather_bytes(std::span<const std::byte> mine) override;
  std::unique_ptr<Collective> split(int color, int key, const std::string& label) override;

 private:
  // Creates the communicator: this group's rank 0 publishes the unique id under `id_key`.
  void init_comm(const std::string& id_key);
  template <class T>
  void all_reduce_impl(std::span<T> data);
  // Runs one collective: the body enqueues NCCL calls and returns the ring-equivalent bytes;
  // then we wait for the stream with the deadline and convert every failure.
  template <class F>
  void run(CollectiveKind kind, size_t n, size_t elem_bytes, F&& enqueue);
  void check(ncclResult_t r, const char* call);
  void check_cuda(cudaError_t e, const char* call);
  // Waits until the communicator is no longer ncclInProgress (non-blocking mode).
  void wait_comm_ready(const char* call);
  void wait_stream();
  [[noreturn]] void fail(const std::string& what);
  uint64_t ring_bytes(int64_t n, size_t elem, bool reduce_scatter, bool all_gather) const;

  std::shared_ptr<Rendezvous> rdzv_;  // shared with the subgroups split from this group
  std::string who_;
  int rank_ = 0;
  int size_ = 1;
  int device_ = 0;
  uint64_t splits_ = 0;
  std::chrono::milliseconds timeout_;
  Stream stream_;
  Comm comm_;
  DeviceBuffer scratch_;
  bool broken_ = false;
  const char* current_op_ = "setup";
};

[[noreturn]] void NcclCollective::fail(const std::string& what) {
  broken_ = true;
  comm_.mark_broken();
  throw CollectiveError(fmt::format("{} (cuda device {}): {}: {}", who_, device_, current_op_, what));
}

void NcclCollective::check(ncclResult_t r, const char* call) {
  if (r == ncclSuccess) return;
  if (r == ncclInProgress) {
    wait_comm_ready(call);
    return;
  }
  const char* last = comm_.get() != nullptr ? ncclGetLastError(comm_.get()) : "";
  fail(fmt::format("{} failed: {}{}{}", call, ncclGetErrorString(r), last && *last ? ": " : "", last ? last : ""));
}

void NcclCollective::check_cuda(cudaError_t e, const char* call) {
  if (e == cudaSuccess) return;
  fail(fmt::format("{} failed: {} ({})", call, cudaGetErrorString(e), static_cast<int>(e)));
}

void NcclCollective::wait_comm_ready(const char* call) {
  const auto deadline = Clock::now() + timeout_;
  for (;;) {
    ncclResult_t state = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(comm_.get(), &state);
    if (r != ncclSuccess) fail(fmt::format("ncclCommGetAsyncError after {}: {}", call, ncclGetErrorString(r)));
    if (state == ncclSuccess) return;
    if (state != ncclInProgress)
      fail(fmt::format("{} failed asynchronously: {}: {}", call, ncclGetErrorString(state),
                       ncclGetLastError(comm_.get())));
    if (Clock::now() >= deadline)
      fail(
          fmt::format("{} still in progress after {} (a peer is missing or stuck)", call, net::seconds_text(timeout_)));
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

void NcclCollective::wait_stream() {
  const auto deadline = Clock::now() + timeout_;
  for (;;) {
    cudaError_t e = cudaStreamQuery(stream_.get());
    if (e == cudaSuccess) return;
    if (e != cudaErrorNotReady) check_cuda(e, "cudaStreamQuery");
    ncclResult_t state = ncclSuccess;
    ncclCommGetAsyncError(comm_.get(), &state);
    if (state != ncclSuccess && state != ncclInProgress)
      fail(fmt::format("NCCL reported {}: {}", ncclGetErrorString(state), ncclGetLastError(comm_.get())));
    if (Clock::now() >= deadline)
      fail(fmt::format("did not complete within {} (a peer died or is stuck)", net::seconds_text(timeout_)));
    std::this_thread::yield();
  }
}

NcclCollective::NcclCollective(const RendezvousOptions& opts)
    : rdzv_(std::make_shared<Rendezvous>(opts)),
      who_(rdzv_->who()),
      rank_(opts.rank),
      size_(opts.size),
      timeout_(opts.timeout) {
  const int count = gpu_count();
  device_ = opts.cuda_device >= 0 ? opts.cuda_device : (count > 0 ? rank_ % count : 0);
  if (device_ >= count) fail(fmt::format("cuda device {} requested but {} device(s) are visible", device_, count));
  init_comm("nccl/unique_id");
}

NcclCollective::NcclCollective(const NcclCollective& parent, const SplitMembers& m, int color, const std::string& label)
    : rdzv_(parent.rdzv_),
      who_(fmt::format("{}, {} rank {}/{}", parent.who_, label, m.index, m.parent_ranks.size())),
      rank_(m.index),
      size_(static_cast<int>(m.parent_ranks.size())),
      device_(parent.device_),
      timeout_(parent.timeout_) {
  init_comm(fmt::format("nccl/split{}/{}/unique_id", parent.splits_, color));
}

void NcclCollective::init_comm(const std::string& id_key) {
  check_cuda(cudaSetDevice(device_), "cudaSetDevice");
  check_cuda(cudaStreamCreateWithFlags(stream_.out(), cudaStreamNonBlocking), "cudaStreamCreate");
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  try {
    if (rank_ == 0) {
      check(ncclGetUniqueId(&id), "ncclGetUniqueId");
      const char* p = reinterpret_cast<const char*>(&id);
      rdzv_->store().set(id_key, std::vector<char>(p, p + sizeof(id)));
    } else {
      std::vector<char> v = rdzv_->store().get(id_key);
      if (v.size() != sizeof(id))
        fail(fmt::format("rank 0 published a unique id of {} bytes, expected {}", v.size(), sizeof(id)));
      std::memcpy(&id, v.data(), sizeof(id));
    }
  } catch (const StoreError& e) {
    throw RendezvousError(fmt::format("{}: exchanging the NCCL unique id failed: {}", who_, e.what()));
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // so a missing peer is a timeout we control, not a hang
  check(ncclCommInitRankConfig(comm_.out(), size_, id, rank_, &config), "ncclCommInitRankConfig");
  wait_comm_ready("ncclCommInitRankConfig");
  if (std::string e = scratch_.reserve(64); !e.empty()) fail(e);
  current_op_ = "";
}

std::unique_ptr<Collective> NcclCollective::split(int color, int key, const std::string& label) {
  const SplitMembers m = split_members(*this, color, key);
  std::unique_ptr<Collective> sub;
  try {
    sub = std::make_unique<NcclCollective>(*this, m, color, label);
  } catch (...) {
    broken_ = true;
    comm_.mark_broken();
    throw;
  }
  ++splits_;
  return sub;
}

NcclCollective::~NcclCollective() {
  if (broken_ || std::uncaught_exceptions() > 0) return;
  try {
    barrier();
  } catch (const std::exception& e) {
    spdlog::warn("{}: closing barrier failed: {}", who_, e.what());
  }
}

uint64_t NcclCollective::ring_bytes(int64_t n, size_t elem, bool rs, bool ag) const {
  if (size_ == 1 || n == 0) return 0;
  const int64_t cr = shard_of(n, rank_, size_).count;
  const int64_t cnext = shard_of(n, (rank_ + 1) % size_, size_).count;
  int64_t e = 0;
  if (rs) e += n - cr;
  if (ag) e += n - cnext;
  return static_cast<uint64_t>(e) * elem;
}

template <class F>
void NcclCollective::run(CollectiveKind kind, size_t n, size_t elem_bytes, F&& enqueue) {
  current_op_ = kind_name(kind);
  if (broken_)
    throw CollectiveError(
        fmt::format("{}: {} called after an earlier collective failed; the group must be rebuilt", who_, current_op_));
  const auto t0 = Clock::now();
  check_cuda(cudaSetDevice(device_), "cudaSetDevice");
  uint64_t sent = enqueue();
  wait_stream();
  KindStats& s = stats_[kind];
  s.calls += 1;
  s.bytes_sent += sent;
  s.payload_bytes += n * elem_bytes;
  s.seconds += std::chrono::duration<double>(Clock::now() - t0).count();
}

template <class T>
void NcclCollective::all_reduce_impl(std::span<T> data) {
  run(CollectiveKind::kAllReduce, data.size(), sizeof(T), [&]() -> uint64_t {
    if (data.empty()) return 0;
    check(ncclAllReduce(data.data(), data.data(), data.size(), nccl_type(data.data()), ncclSum, comm_.get(),
                        stream_.get()),
          "ncclAllReduce");
    return ring_bytes(static_cast<int64_t>(data.size()), sizeof(T), true, true);
  });
}

void NcclCollective::reduce_scatter_sum(std::span<const float> in, std::span<float> out) {
  const int64_t n = static_cast<int64_t>(in.size());
  const ShardRange mine = shard_of(n, rank_, size_);
  if (static_cast<int64_t>(out.size()) != mine.count)
    throw CollectiveError(
        fmt::format("{}: reduce_scatter_sum of {} elements: out has {} elements, this rank's "
                    "shard has {}",
                    who_, n, out.size(), mine.count));
  run(CollectiveKind::kReduceScatter, in.size(), sizeof(float), [&]() -> uint64_t {
    if (n == 0) return 0;
    if (n % size_ == 0) {
      check(ncclReduceScatter(in.data(), out.data(), static_cast<size_t>(n / size_), ncclFloat32, ncclSum, comm_.get(),
                              stream_.get()),
            "ncclReduceScatter");
    } else {
      check(ncclGroupStart(), "ncclGroupStart");
      for (int j = 0; j < size_; ++j) {
        ShardRange s = shard_of(n, j, size_);
        if (s.count == 0) continue;
        // recvbuff matters only on the root; elsewhere any valid device pointer will do.
        void* recv = j == rank_ ? static_cast<void*>(out.data()) : const_cast<float*>(in.data() + s.offset);
        check(ncclReduce(in.data() + s.offset, recv, static_cast<size_t>(s.count), ncclFloat32, ncclSum, j, comm_.get(),
                         stream_.get()),
              "ncclReduce");
      }
      check(ncclGroupEnd(), "ncclGroupEnd");
    }
    return ring_bytes(n, sizeof(float), true, false);
  });
}

void NcclCollective::all_gather(std::span<const float> my_shard, std::span<float> out) {
  const int64_t n = static_cast<int64_t>(out.size());
  const ShardRange mine = shard_of(n, rank_, size_);
  if (static_cast<int64_t>(my_shard.size()) != mine.count)
    throw CollectiveError(
        fmt::format("{}: all_gather into {} elements: my_shard has {} elements, this rank's "
                    "shard has {}",
                    who_, n, my_shard.size(), mine.count));
  run(CollectiveKind::kAllGather, out.size(), sizeof(float), [&]() -> uint64_t {
    if (n == 0) return 0;
    if (n % size_ == 0) {
      check(ncclAllGather(my_shard.data(), out.data(), static_cast<size_t>(mine.count), ncclFloat32, comm_.get(),
                          stream_.get()),
            "ncclAllGather");
    } else {
      check(ncclGroupStart(), "ncclGroupStart");
      for (int j = 0; j < size_; ++j) {
        ShardRange s = shard_of(n, j, size_);
        if (s.count == 0) continue;
        const void* send = j == rank_ ? static_cast<const void*>(my_shard.data()) : out.data() + s.offset;
        check(ncclBroadcast(send, out.data() + s.offset, static_cast<size_t>(s.count), ncclFloat32, j, comm_.get(),
                            stream_.get()),
              "ncclBroadcast");
      }
      check(ncclGroupEnd(), "ncclGroupEnd");
    }
    return ring_bytes(n, sizeof(float), false, true);
  });
}

void NcclCollective::broadcast(std::span<float> data, int root) {
  if (root < 0 || root >= size_)
    throw CollectiveError(fmt::format("{}: broadcast root {} is outside [0, {})", who_, root, size_));
  run(CollectiveKind::kBroadcast, data.size(), sizeof(float), [&]() -> uint64_t {
    if (data.empty()) return 0;
    check(ncclBroadcast(data.data(), data.data(), data.size(), ncclFloat32, root, comm_.get(), stream_.get()),
          "ncclBroadcast");
    // Ring pipeline: every rank forwards n elements except the one just before the root.
    const bool last = (rank_ + 1) % size_ == root;
    return size_ == 1 || last ? 0 : data.size_bytes();
  });
}

void NcclCollective::barrier() {
  // NCCL has no barrier: an all-reduce of one float on the stream, waited for, is one.
  run(CollectiveKind::kBarrier, 0, 1, [&]() -> uint64_t {
    check(ncclAllReduce(scratch_.get(), scratch_.get(), 1, ncclFloat32, ncclSum, comm_.get(), stream_.get()),
          "ncclAllReduce (barrier)");
    return ring_bytes(1, sizeof(float), true, true);
  });
}

std::vector<std::vector<std::byte>> NcclCollective::all_gather_bytes(std::span<const std::byte> mine) {
  std::vector<std::vector<std::byte>> result(static_cast<size_t>(size_));
  const size_t P = static_cast<size_t>(size_);
  std::vector<uint64_t> lens(P, 0);
  // Step 1: every rank's length (device staging, then back to the host).
  run(CollectiveKind::kAllGatherBytes, 0, 1, [&]() -> uint64_t {
    std::string err = scratch_.reserve(P * sizeof(uint64_t) * 2);
    if (!err.empty()) fail(err);
    uint64_t my_len = mine.size();
    auto* dev = static_cast<uint64_t*>(scratch_.get());
    check_cuda(cudaMemcpyAsync(dev + P, &my_len, sizeof(my_len), cudaMemcpyHostToDevice, stream_.get()),
               "cudaMemcpyAsync");
    check(ncclAllGather(dev + P, dev, 1, ncclUint64, comm_.get(), stream_.get()), "ncclAllGather (lengths)");
    return ring_bytes(static_cast<int64_t>(P), sizeof(uint64_t), false, true);
  });
  check_cuda(cudaMemcpy(lens.data(), scratch_.get(), P * sizeof(uint64_t), cudaMemcpyDeviceToHost), "cudaMemcpy");
  uint64_t max_len = 0;
  for (uint64_t l : lens) max_len = std::max(max_len, l);
  if (max_len > (uint64_t{1} << 32)) fail(fmt::format("a rank announced an implausible {} bytes", max_len));
  if (max_len == 0) return result;
  // Step 2: blobs padded to the longest, gathered, trimmed on the host.
  std::vector<std::byte> host(P * max_len);
  run(CollectiveKind::kAllGatherBytes, mine.size(), 1, [&]() -> uint64_t {
    std::string err = scratch_.reserve(P * max_len + max_len);
    if (!err.empty()) fail(err);
    auto* dev = static_cast<std::byte*>(scratch_.get());
    if (!mine.empty())
      check_cuda(cudaMemcpyAsync(dev + P * max_len, mine.data(), mine.size(), cudaMemcpyHostToDevice, stream_.get()),
                 "cudaMemcpyAsync");
    check(ncclAllGather(dev + P * max_len, dev, max_len, ncclUint8, comm_.get(), stream_.get()),
          "ncclAllGather (bytes)");
    return ring_bytes(static_cast<int64_t>(P * max_len), 1, false, true);
  });
  check_cuda(cudaMemcpy(host.data(), scratch_.get(), host.size(), cudaMemcpyDeviceToHost), "cudaMemcpy");
  stats_[CollectiveKind::kAllGatherBytes].calls -= 1;  // two internal steps, one call
  for (size_t i = 0; i < P; ++i)
    result[i].assign(host.begin() + static_cast<std::ptrdiff_t>(i * max_len),
                     host.begin() + static_cast<std::ptrdiff_t>(i * max_len + lens[i]));
  return result;
}

}  // namespace

std::unique_ptr<Collective> make_nccl(const RendezvousOptions& opts) {
  opts.validate();
  // Before the rendezvous: a machine without a GPU fails at once with the reason, instead
  // of making its peers wait for the timeout.
  if (!gpu_available())
    throw CollectiveError(fmt::format("site {} rank {}: the NCCL backend needs a CUDA device: {}", opts.site, opts.rank,
                                      gpu_unavailable_reason()));
  return std::make_unique<NcclCollective>(opts);
}

}  // namespace geoloco::parallel

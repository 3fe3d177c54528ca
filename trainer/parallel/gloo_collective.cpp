#include "trainer/parallel/gloo_collective.hpp"

#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include <signal.h>

#include <chrono>
#include <cstring>
#include <exception>
#include <type_traits>

#include "core/log.hpp"
#include "trainer/parallel/errors.hpp"

namespace geoloco::parallel {
namespace {

using Clock = std::chrono::steady_clock;
using UBuf = std::unique_ptr<gloo::transport::UnboundBuffer>;

int mod(int a, int p) { return ((a % p) + p) % p; }

// Grow-only scratch memory, not zero-filled (every byte is written before it is read).
class Scratch {
 public:
  std::byte* get(size_t bytes) {
    if (bytes > size_) {
      data_ = std::make_unique_for_overwrite<std::byte[]>(bytes);
      size_ = bytes;
    }
    return data_.get();
  }

 private:
  std::unique_ptr<std::byte[]> data_;
  size_t size_ = 0;
};

class GlooCollective final : public Collective {
 public:
  explicit GlooCollective(const RendezvousOptions& opts);
  // A subgroup of `parent` (split()): its store and device, its own context under `prefix`.
  GlooCollective(const GlooCollective& parent, const SplitMembers& m, int color, const std::string& label);
  ~GlooCollective() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& site() const override { return rdzv_->options().site; }
  const char* backend() const override { return "gloo"; }
  MemorySpace memory() const override { return MemorySpace::kHost; }

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
  void connect(const std::string& prefix);
  // Runs one collective: counts it, times it, converts backend errors into CollectiveError
  // with context, and marks the group broken on failure.
  template <class F>
  void run(CollectiveKind kind, size_t n, size_t elem_bytes, F&& body);

  template <class T>
  void all_reduce_impl(std::span<T> data);
  // Ring reduce-scatter of n elements: afterwards acc[shard r] holds the sum over ranks of
  // in[shard r]. acc may alias in (all_reduce); other parts of acc hold partial sums.
  template <class T>
  uint64_t ring_reduce_scatter(const T* in, T* acc, int64_t n);
  // Ring all-gather: rank i's chunk [off[i], off[i] + len[i]) of base must be in place.
  uint64_t ring_all_gather(std::byte* base, size_t total, const std::vector<size_t>& off,
                           const std::vector<size_t>& len);
  // Sends sbytes at sptr to dst and receives rbytes into rptr from src (either may be 0),
  // cut into segments of segment_bytes_ that are all in flight at once; on_segment(offset,
  // len) runs for each received segment in order as soon as it has arrived, so the caller's
  // reduction overlaps the rest of the transfer.
  template <class OnSegment>
  void exchange(const void* sptr, size_t sbytes, int dst, void* rptr, size_t rbytes, int src, uint64_t slot,
                OnSegment&& on_segment);
  void exchange(const void* sptr, size_t sbytes, int dst, void* rptr, size_t rbytes, int src, uint64_t slot) {
    exchange(sptr, sbytes, dst, rptr, rbytes, src, slot, [](size_t, size_t) {});
  }
  // Slot layout: [op sequence : 32][step : 16][segment : 16].
  uint64_t next_slot_base() { return (seq_++) << 32; }
  static uint64_t step_slot(uint64_t base, int step) { return base + (static_cast<uint64_t>(step) << 16); }

  std::shared_ptr<Rendezvous> rdzv_;  // shared with the subgroups split from this group
  std::string who_;                   // "site paris rank 1/4" (a subgroup: ", group 0 rank 1/2")
  int rank_ = 0;
  int size_ = 1;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::rendezvous::Context> context_;
  Scratch scratch_;       // reduce_scatter's accumulator (n elements)
  Scratch recv_scratch_;  // one chunk being received
  uint64_t seq_ = 1;
  uint64_t splits_ = 0;  // split() calls so far: each subgroup's store keys are its own
  bool broken_ = false;
  const char* current_op_ = "";
  size_t segment_bytes_ = size_t{1} << 20;
};

GlooCollective::GlooCollective(const RendezvousOptions& opts)
    : rdzv_(std::make_shared<Rendezvous>(opts)),
      who_(rdzv_->who()),
      rank_(opts.rank),
      size_(opts.size),
      timeout_(opts.timeout),
      segment_bytes_(opts.segment_bytes) {
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = opts.bind_address;
    device_ = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    throw CollectiveError(fmt::format("{}: gloo device on {} failed: {}", who_, opts.bind_address, e.what()));
  }
  // Namespaced so gloo's keys ("0", "1", ...) cannot collide with ours.
  connect("gloo");
}

GlooCollective::GlooCollective(const GlooCollective& parent, const SplitMembers& m, int color, const std::string& label)
    : rdzv_(parent.rdzv_),
      who_(fmt::format("{}, {} rank {}/{}", parent.who_, label, m.index, m.parent_ranks.size())),
      rank_(m.index),
      size_(static_cast<int>(m.parent_ranks.size())),
      timeout_(parent.timeout_),
      device_(parent.device_),
      segment_bytes_(parent.segment_bytes_) {
  connect(fmt::format("gloo/split{}/{}", parent.splits_, color));
}

void GlooCollective::connect(const std::string& prefix) {
  try {
    context_ = std::make_shared<gloo::rendezvous::Context>(rank_, size_);
    context_->setTimeout(timeout_);
    gloo::rendezvous::PrefixStore prefixed(prefix, rdzv_->store());
    context_->connectFullMesh(prefixed, device_);
  } catch (const Error& e) {
    throw RendezvousError(fmt::format("{}: gloo full-mesh setup failed: {}", who_, e.what()));
  } catch (const std::exception& e) {
    throw CollectiveError(
        fmt::format("{}: gloo full-mesh setup on {} failed: {}", who_, rdzv_->options().bind_address, e.what()));
  }
}

std::unique_ptr<Collective> GlooCollective::split(int color, int key, const std::string& label) {
  const SplitMembers m = split_members(*this, color, key);
  std::unique_ptr<Collective> sub;
  try {
    sub = std::make_unique<GlooCollective>(*this, m, color, label);
  } catch (...) {
    broken_ = true;
    throw;
  }
  ++splits_;
  return sub;
}

GlooCollective::~GlooCollective() {
  if (broken_ || std::uncaught_exceptions() > 0) return;
  try {
    barrier();
  } catch (const std::exception& e) {
    spdlog::warn("{}: closing barrier failed: {}", who_, e.what());
  }
}

template <class F>
void GlooCollective::run(CollectiveKind kind, size_t n, size_t elem_bytes, F&& body) {
  current_op_ = kind_name(kind);
  if (broken_)
    throw CollectiveError(
        fmt::format("{}: {} called after an earlier collective failed; the group must be rebuilt", who_, current_op_));
  const auto t0 = Clock::now();
  uint64_t sent = 0;
  try {
    sent = body();
  } catch (const CollectiveError&) {
    broken_ = true;
    throw;
  } catch (const std::exception& e) {
    broken_ = true;
    throw CollectiveError(fmt::format("{}: {} of {} elements failed: {}", who_, current_op_, n, e.what()));
  }
  KindStats& s = stats_[kind];
  s.calls += 1;
  s.bytes_sent += sent;
  s.payload_bytes += n * elem_bytes;
  s.seconds += std::chrono::duration<double>(Clock::now() - t0).count();
}

template <class OnSegment>
void GlooCollective::exchange(const void* sptr, size_t sbytes, int dst, void* rptr, size_t rbytes, int src,
                              uint64_t slot, OnSegment&& on_segment) {
  const size_t seg = segment_bytes_;
  const size_t nsend = (sbytes + seg - 1) / seg, nrecv = (rbytes + seg - 1) / seg;
  if (std::max(nsend, nrecv) > 0xFFFF)
    throw CollectiveError(fmt::format("{}: {}: {} bytes need more than 65535 segments of {} bytes", who_, current_op_,
                                      std::max(sbytes, rbytes), seg));
  // One unbound buffer per segment: gloo allows one pending operation per buffer.
  std::vector<UBuf> recvs, sends;
  recvs.reserve(nrecv);
  sends.reserve(nsend);
  auto* rbase = static_cast<char*>(rptr);
  auto* sbase = static_cast<char*>(const_cast<void*>(sptr));
  for (size_t k = 0; k < nrecv; ++k) {
    const size_t len = std::min(seg, rbytes - k * seg);
    recvs.push_back(context_->createUnboundBuffer(rbase + k * seg, len));
    recvs.back()->recv(src, slot + k);
  }
  for (size_t k = 0; k < nsend; ++k) {
    const size_t len = std::min(seg, sbytes - k * seg);
    sends.push_back(context_->createUnboundBuffer(sbase + k * seg, len));
    sends.back()->send(dst, slot + k);
  }
  // gloo throws IoException on timeout or a closed peer; false means aborted.
  for (size_t k = 0; k < nrecv; ++k) {
    if (!recvs[k]->waitRecv(timeout_))
      throw CollectiveError(fmt::format("{}: {}: receive from rank {} was aborted", who_, current_op_, src));
    on_segment(k * seg, std::min(seg, rbytes - k * seg));
  }
  for (size_t k = 0; k < nsend; ++k)
    if (!sends[k]->waitSend(timeout_))
      throw CollectiveError(fmt::format("{}: {}: send to rank {} was aborted", who_, current_op_, dst));
}

template <class T>
uint64_t GlooCollective::ring_reduce_scatter(const T* in, T* acc, int64_t n) {
  const int P = size_, r = rank_;
  if (P == 1) {
    if (acc != in) std::memcpy(acc, in, static_cast<size_t>(n) * sizeof(T));
    return 0;
  }
  const int right = mod(r + 1, P), left = mod(r - 1, P);
  const int64_t max_chunk = shard_of(n, 0, P).count;
  T* tmp = reinterpret_cast<T*>(recv_scratch_.get(static_cast<size_t>(max_chunk) * sizeof(T)));
  const uint64_t slot = next_slot_base();
  uint64_t sent = 0;
  for (int s = 0; s < P - 1; ++s) {
    // Step s: send chunk r-s-1 (ours at s = 0, the partial we summed at s-1 after), receive
    // chunk r-s-2 from the left and add our input to it. After P-1 steps the last chunk
    // summed is chunk r: complete.
    const ShardRange sc = shard_of(n, mod(r - s - 1, P), P);
    const ShardRange rc = shard_of(n, mod(r - s - 2, P), P);
    const T* send_from = (s == 0 ? in : acc) + sc.offset;
    const T* src = in + rc.offset;
    T* dst = acc + rc.offset;
    exchange(send_from, static_cast<size_t>(sc.count) * sizeof(T), right, tmp,
             static_cast<size_t>(rc.count) * sizeof(T), left, step_slot(slot, s), [&](size_t off, size_t len) {
               const size_t first = off / sizeof(T), count = len / sizeof(T);
               for (size_t i = first; i < first + count; ++i) dst[i] = tmp[i] + src[i];
             });
    sent += static_cast<uint64_t>(sc.count) * sizeof(T);
  }
  return sent;
}

uint64_t GlooCollective::ring_all_gather(std::byte* base, size_t total, const std::vector<size_t>& off,
                                         const std::vector<size_t>& len) {
  const int P = size_, r = rank_;
  if (P == 1 || total == 0) return 0;
  const int right = mod(r + 1, P), left = mod(r - 1, P);
  const uint64_t slot = next_slot_base();
  uint64_t sent = 0;
  for (int s = 0; s < P - 1; ++s) {
    // Step s: forward chunk r-s (ours at s = 0, received at s-1 after), receive chunk r-s-1.
    const size_t sc = static_cast<size_t>(mod(r - s, P));
    const size_t rc = static_cast<size_t>(mod(r - s - 1, P));
    exchange(base + off[sc], len[sc], right, base + off[rc], len[rc], left, step_slot(slot, s));
    sent += len[sc];
  }
  return sent;
}

template <class T>
void GlooCollective::all_reduce_impl(std::span<T> data) {
  const int64_t n = static_cast<int64_t>(data.size());
  run(CollectiveKind::kAllReduce, data.size(), sizeof(T), [&]() -> uint64_t {
    if (n == 0) return 0;
    uint64_t sent = ring_reduce_scatter<T>(data.data(), data.data(), n);
    std::vector<size_t> off(static_cast<size_t>(size_)), len(static_cast<size_t>(size_));
    for (int i = 0; i < size_; ++i) {
      ShardRange s = shard_of(n, i, size_);
      off[static_cast<size_t>(i)] = static_cast<size_t>(s.offset) * sizeof(T);
      len[static_cast<size_t>(i)] = static_cast<size_t>(s.count) * sizeof(T);
    }
    sent += ring_all_gather(reinterpret_cast<std::byte*>(data.data()), data.size_bytes(), off, len);
    return sent;
  });
}

void GlooCollective::reduce_scatter_sum(std::span<const float> in, std::span<float> out) {
  const int64_t n = static_cast<int64_t>(in.size());
  const ShardRange mine = shard_of(n, rank_, size_);
  if (static_cast<int64_t>(out.size()) != mine.count)
    throw CollectiveError(
        fmt::format("{}: reduce_scatter_sum of {} elements: out has {} elements, this rank's "
                    "shard has {}",
                    who_, n, out.size(), mine.count));
  run(CollectiveKind::kReduceScatter, in.size(), sizeof(float), [&]() -> uint64_t {
    if (n == 0) return 0;
    float* acc = reinterpret_cast<float*>(scratch_.get(in.size_bytes()));
    uint64_t sent = ring_reduce_scatter<float>(in.data(), acc, n);
    if (!out.empty()) std::memcpy(out.data(), acc + mine.offset, out.size_bytes());
    return sent;
  });
}

void GlooCollective::all_gather(std::span<const float> my_shard, std::span<float> out) {
  const int64_t n = static_cast<int64_t>(out.size());
  const ShardRange mine = shard_of(n, rank_, size_);
  if (static_cast<int64_t>(my_shard.size()) != mine.count)
    throw CollectiveError(
        fmt::format("{}: all_gather into {} elements: my_shard has {} elements, this rank's "
                    "shard has {}",
                    who_, n, my_shard.size(), mine.count));
  run(CollectiveKind::kAllGather, out.size(), sizeof(float), [&]() -> uint64_t {
    if (n == 0) return 0;
    float* dst = out.data() + mine.offset;
    if (my_shard.data() != dst && mine.count > 0) std::memmove(dst, my_shard.data(), my_shard.size_bytes());
    std::vector<size_t> off(static_cast<size_t>(size_)), len(static_cast<size_t>(size_));
    for (int i = 0; i < size_; ++i) {
      ShardRange s = shard_of(n, i, size_);
      off[static_cast<size_t>(i)] = static_cast<size_t>(s.offset) * sizeof(float);
      len[static_cast<size_t>(i)] = static_cast<size_t>(s.count) * sizeof(float);
    }
    return ring_all_gather(reinterpret_cast<std::byte*>(out.data()), out.size_bytes(), off, len);
  });
}

void GlooCollective::broadcast(std::span<float> data, int root) {
  if (root < 0 || root >= size_)
    throw CollectiveError(fmt::format("{}: broadcast root {} is outside [0, {})", who_, root, size_));
  run(CollectiveKind::kBroadcast, data.size(), sizeof(float), [&]() -> uint64_t {
    if (data.empty() || size_ == 1) return 0;
    const uint64_t slot = next_slot_base();
    if (rank_ != root) {
      exchange(nullptr, 0, root, data.data(), data.size_bytes(), root, slot);
      return 0;
    }
    // Root: every peer's segments in flight at once, then wait for all of them.
    const size_t seg = segment_bytes_;
    const size_t nseg = (data.size_bytes() + seg - 1) / seg;
    if (nseg > 0xFFFF)
      throw CollectiveError(fmt::format("{}: broadcast of {} bytes needs more than 65535 segments of {} bytes", who_,
                                        data.size_bytes(), seg));
    auto* base = reinterpret_cast<char*>(data.data());
    std::vector<std::pair<int, UBuf>> sends;
    for (int i = 0; i < size_; ++i) {
      if (i == root) continue;
      for (size_t k = 0; k < nseg; ++k) {
        const size_t len = std::min(seg, data.size_bytes() - k * seg);
        sends.emplace_back(i, context_->createUnboundBuffer(base + k * seg, len));
        sends.back().second->send(i, slot + k);
      }
    }
    for (auto& [peer, b] : sends)
      if (!b->waitSend(timeout_))
        throw CollectiveError(fmt::format("{}: broadcast: send to rank {} was aborted", who_, peer));
    return static_cast<uint64_t>(size_ - 1) * data.size_bytes();
  });
}

void GlooCollective::barrier() {
  run(CollectiveKind::kBarrier, 0, 1, [&]() -> uint64_t {
    uint64_t sent = 0;
    const uint64_t slot = next_slot_base();
    char out_byte = 1, in_byte = 0;
    // Dissemination: after round k every rank has heard (transitively) from 2^(k+1) ranks.
    for (int dist = 1, round = 0; dist < size_; dist *= 2, ++round) {
      exchange(&out_byte, 1, mod(rank_ + dist, size_), &in_byte, 1, mod(rank_ - dist, size_), step_slot(slot, round));
      sent += 1;
    }
    return sent;
  });
}

std::vector<std::vector<std::byte>> GlooCollective::all_gather_bytes(std::span<const std::byte> mine) {
  std::vector<std::vector<std::byte>> result(static_cast<size_t>(size_));
  run(CollectiveKind::kAllGatherBytes, mine.size(), 1, [&]() -> uint64_t {
    const size_t P = static_cast<size_t>(size_);
    std::vector<uint64_t> lens(P, 0);
    lens[static_cast<size_t>(rank_)] = mine.size();
    std::vector<size_t> off(P), len(P, sizeof(uint64_t));
    for (size_t i = 0; i < P; ++i) off[i] = i * sizeof(uint64_t);
    uint64_t sent = ring_all_gather(reinterpret_cast<std::byte*>(lens.data()), P * sizeof(uint64_t), off, len);
    size_t total = 0;
    for (size_t i = 0; i < P; ++i) {
      if (lens[i] > (uint64_t{1} << 40))
        throw CollectiveError(
            fmt::format("{}: all_gather_bytes: rank {} announced an implausible {} bytes", who_, i, lens[i]));
      off[i] = total;
      len[i] = static_cast<size_t>(lens[i]);
      total += len[i];
    }
    std::vector<std::byte> all(total);
    if (!mine.empty()) std::memcpy(all.data() + off[static_cast<size_t>(rank_)], mine.data(), mine.size());
    sent += ring_all_gather(all.data(), total, off, len);
    for (size_t i = 0; i < P; ++i)
      result[i].assign(all.begin() + static_cast<std::ptrdiff_t>(off[i]),
                       all.begin() + static_cast<std::ptrdiff_t>(off[i] + len[i]));
    return sent;
  });
  return result;
}

}  // namespace

std::unique_ptr<Collective> make_gloo(const RendezvousOptions& opts) {
  // gloo's TCP pairs write without MSG_NOSIGNAL: a peer that dies mid-transfer would kill
  // this process with SIGPIPE instead of surfacing as an I/O error we can report. Ignore it
  // (process-wide, once; only when nobody installed a handler of their own).
  static const bool sigpipe_ignored = [] {
    struct sigaction old {};
    if (::sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) {
      struct sigaction ign {};
      ign.sa_handler = SIG_IGN;
      sigemptyset(&ign.sa_mask);
      ::sigaction(SIGPIPE, &ign, nullptr);
    }
    return true;
  }();
  (void)sigpipe_ignored;
  return std::make_unique<GlooCollective>(opts);
}

}  // namespace geoloco::parallel

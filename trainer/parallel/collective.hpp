// One intra-site collective interface, two backends:
//   make_gloo (gloo_collective.hpp)  CPU buffers, TCP between ranks
//   make_nccl (nccl_collective.hpp)  CUDA device buffers, only when GEOLOCO_HAVE_CUDA
//
// Every call is a blocking collective: all ranks of the site call it in the same order with
// the same element count (n) and root. Element buffers live in memory(): host memory for
// Gloo, CUDA device memory for NCCL (a std::span over a device pointer is never read on the
// host). all_gather_bytes always takes and returns host memory.
//
// Sharding for reduce_scatter/all_gather: shard_of() in shard.hpp (contiguous, balanced,
// the first n % size ranks own one extra element, no padding; uneven n is fine).
//
// Determinism: the same inputs give the same bits on every run, and every rank ends with
// exactly the same bits after all_reduce_sum/all_gather/broadcast (each output element is
// reduced once, by one rank, then copied). reduce_scatter_sum followed by all_gather gives
// the same bits as all_reduce_sum.
//
// Errors: a failed collective throws CollectiveError naming site, rank, operation and size;
// afterwards the object is broken (every further call throws) and must be destroyed.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/shard.hpp"

namespace geoloco::parallel {

enum class CollectiveKind : int {
  kAllReduce = 0,
  kReduceScatter,
  kAllGather,
  kBroadcast,
  kBarrier,
  kAllGatherBytes,
  kCount,
};
const char* kind_name(CollectiveKind k);

struct KindStats {
  uint64_t calls = 0;
  // Bytes this rank sent on the wire for these calls (what the algorithm sends, excluding
  // framing): ring all_reduce of n floats sends (2n - c_r - c_{r+1}) * 4 where c_i is
  // shard_of(n, i, size).count, i.e. about 2 (size-1)/size * 4n.
  uint64_t bytes_sent = 0;
  // Bytes of the caller's buffer (n * element size) summed over calls.
  uint64_t payload_bytes = 0;
  double seconds = 0;
};

struct CollectiveStats {
  std::array<KindStats, static_cast<size_t>(CollectiveKind::kCount)> by_kind{};

  KindStats& operator[](CollectiveKind k) { return by_kind[static_cast<size_t>(k)]; }
  const KindStats& operator[](CollectiveKind k) const { return by_kind[static_cast<size_t>(k)]; }
  uint64_t total_bytes_sent() const;
  // {"all_reduce": {"calls":..,"bytes_sent":..,"payload_bytes":..,"seconds":..}, ..., "total_bytes_sent": ..}
  nlohmann::json to_json() const;
};

enum class MemorySpace { kHost, kCuda };

class Collective {
 public:
  virtual ~Collective() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const std::string& site() const = 0;
  virtual const char* backend() const = 0;  // "gloo" | "nccl"
  virtual MemorySpace memory() const = 0;

  // data[i] <- sum over ranks of data[i], in place.
  virtual void all_reduce_sum(std::span<float> data) = 0;
  virtual void all_reduce_sum(std::span<double> data) = 0;
  virtual void all_reduce_sum(std::span<uint64_t> data) = 0;  // wraps modulo 2^64

  // in: the full buffer (n elements, same n on every rank). out: this rank's shard,
  // out.size() == shard_of(n, rank(), size()).count; out[i] <- sum over ranks of
  // in[offset + i]. `in` is not modified. out must not overlap in.
  virtual void reduce_scatter_sum(std::span<const float> in, std::span<float> out) = 0;
  // my_shard: shard_of(n, rank(), size()).count elements; out: n elements, every rank's
  // shard at its offset. my_shard may already sit at its place inside out.
  virtual void all_gather(std::span<const float> my_shard, std::span<float> out) = 0;
  // data <- root's data on every rank.
  virtual void broadcast(std::span<float> data, int root) = 0;
  virtual void barrier() = 0;
  // Host memory in every backend: returns every rank's blob, indexed by rank (blobs may
  // differ in length). For metadata (shapes, hashes, counters), not bulk data.
  virtual std::vector<std::vector<std::byte>> all_gather_bytes(std::span<const std::byte> mine) = 0;

  // Splits this group into subgroups (as MPI_Comm_split): every rank calls it, in the same
  // order as its other collectives; ranks passing the same `color` (>= 0) form one new group,
  // ranked by `key` (ties by rank here). `label` names the new group in its errors ("group 1").
  // The new group shares this one's rendezvous store and backend device: it must be destroyed
  // before this one. A failed split breaks this group as any failed collective does. The
  // default (test doubles) throws CollectiveError: the backend cannot split.
  virtual std::unique_ptr<Collective> split(int color, int key, const std::string& label);

  const CollectiveStats& stats() const { return stats_; }

 protected:
  CollectiveStats stats_;
};

// The membership of `me`'s new group in a split: every rank's (color, key) gathered over
// `parent` (host bytes), the ranks of `color` ordered by (key, rank). Backends call it from
// split(). Throws CollectiveError for a negative color.
struct SplitMembers {
  std::vector<int> parent_ranks;  // the new group's members, by new rank
  int index = 0;                  // this rank's place in it
};
SplitMembers split_members(Collective& parent, int color, int key);

}  // namespace geoloco::parallel

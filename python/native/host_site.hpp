// HostSite: the outer loop's seam (outer_optimizer/site.hpp) over parameters another program
// owns -- one rank of a PyTorch site. The parameters are host fp32 tensors given by address
// and size, in the model's order (the Python side stages GPU or other-dtype tensors into such
// host tensors around the calls: `stage_in` before a read, `stage_out` after a write). The
// site's collectives (the outer loop's votes and sums, the all-gather of the shard after a
// merge) go through the program's own process group, as callbacks.
//
// When the tensors lie end to end in memory (geoloco.flatten_parameters) and are not staged, the
// shard is handed to the outer loop in place: no copy in or out.
//
// Calls come from the thread that drives the outer loop (outer_optimizer/site.hpp), the one
// that calls Python: the callbacks are plain std::functions; the binding wraps Python's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "core/shard.hpp"
#include "outer_optimizer/site.hpp"

namespace geoloco::python {

// One parameter tensor of the program's model, as the outer loop sees it: host fp32,
// contiguous, `numel` values at `data`.
struct HostTensor {
  std::string name;
  float* data = nullptr;
  int64_t numel = 0;
  std::vector<int64_t> shape;
};

struct HostSiteCallbacks {
  // Every rank's bytes in rank order (this rank's included). Needed when ranks > 1.
  std::function<std::vector<std::vector<std::byte>>(std::span<const std::byte>)> all_gather;
  // The element-wise sum over the site's ranks. Needed when ranks > 1.
  std::function<std::vector<double>(const std::vector<double>&)> sum;
  // Before the tensors are read / after they were written (staged tensors); may be empty.
  std::function<void()> stage_in, stage_out;
  // outer.inner_state: reset: the program's inner optimizer state is reset.
  std::function<void()> reset_inner_state;
};

class HostSite final : public outer::Site {
 public:
  // `tensors` tile the flat parameters in order; every rank holds them all (DDP,
  // ZeroRedundancyOptimizer): each rank's merged shard is all-gathered into every rank.
  HostSite(std::vector<HostTensor> tensors, int rank, int ranks, HostSiteCallbacks callbacks);
  // A sharded inner loop: this rank holds only its shard of the `total` flat values,
  // shard_of(total, rank, ranks), in `tensors` (in order); a merge writes it and nothing is
  // gathered (the other ranks hold theirs). Throws InputError when the sizes disagree.
  HostSite(std::vector<HostTensor> tensors, int64_t total, int rank, int ranks, HostSiteCallbacks callbacks);

  int rank() const override { return rank_; }
  int ranks() const override { return ranks_; }
  ShardRange shard() const override { return shard_; }
  std::span<float> shard_params() override;
  void shard_updated() override;
  void reset_inner_state() override;
  std::vector<std::vector<std::byte>> all_gather(std::span<const std::byte> mine) override;
  void sum(std::span<double> values) override;

  int64_t total() const { return total_; }
  // The shard is handed to the outer loop in place (the tensors lie end to end, unstaged).
  bool in_place() const { return in_place_ != nullptr; }
  const std::vector<HostTensor>& tensors() const { return tensors_; }
  // Copies [begin, end) of the flat parameters out of / into the tensors.
  void read(int64_t begin, std::span<float> out) const;
  void write(int64_t begin, std::span<const float> in);

 private:
  template <typename Fn>
  void walk(int64_t begin, int64_t n, Fn&& fn) const;

  std::vector<HostTensor> tensors_;
  std::vector<int64_t> offsets_;  // each tensor's first element in the flat buffer
  int64_t total_ = 0;
  int rank_, ranks_;
  ShardRange shard_;
  HostSiteCallbacks cb_;
  std::vector<float> shard_buf_;  // the shard handed to the outer loop between read and write
  bool sharded_ = false;          // this rank holds only its shard
  // The tensors lie end to end in one block of memory (geoloco.flatten_parameters) and are not
  // staged: the outer loop reads and writes the shard in place, with no copy (as the native site).
  float* in_place_ = nullptr;
};

}  // namespace geoloco::python

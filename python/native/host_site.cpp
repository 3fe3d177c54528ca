// HostSite (host_site.hpp): the seam over host tensors another program owns.
#include "python/native/host_site.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "core/error.hpp"

namespace geoloco::python {

HostSite::HostSite(std::vector<HostTensor> tensors, int rank, int ranks, HostSiteCallbacks callbacks)
    : tensors_(std::move(tensors)), rank_(rank), ranks_(ranks), cb_(std::move(callbacks)) {
  if (ranks_ < 1 || rank_ < 0 || rank_ >= ranks_)
    throw InputError(fmt::format("rank {} of a site of {} ranks", rank_, ranks_));
  for (const auto& t : tensors_) {
    if (t.numel <= 0) throw InputError(fmt::format("parameter '{}' has no elements", t.name));
    if (t.data == nullptr) throw InputError(fmt::format("parameter '{}' has no data", t.name));
    offsets_.push_back(total_);
    total_ += t.numel;
  }
  if (tensors_.empty()) throw InputError("no parameters were given");
  if (ranks_ > 1 && (!cb_.all_gather || !cb_.sum))
    throw InputError(fmt::format("a site of {} ranks needs the site's all_gather and sum", ranks_));
  shard_ = shard_of(total_, rank_, ranks_);
  bool end_to_end = !cb_.stage_in && !cb_.stage_out;
  for (size_t i = 1; i < tensors_.size() && end_to_end; ++i)
    end_to_end = tensors_[i].data == tensors_[i - 1].data + tensors_[i - 1].numel;
  if (end_to_end)
    in_place_ = tensors_[0].data;  // value j of the flat parameters (from offsets_[0]) at in_place_[j - offsets_[0]]
  else
    shard_buf_.resize(static_cast<size_t>(shard_.count));
}

HostSite::HostSite(std::vector<HostTensor> tensors, int64_t total, int rank, int ranks, HostSiteCallbacks callbacks)
    : HostSite(std::move(tensors), rank, ranks, std::move(callbacks)) {
  const int64_t held = total_;
  total_ = total;
  sharded_ = true;
  shard_ = shard_of(total_, rank_, ranks_);
  if (held != shard_.count)
    throw InputError(
        fmt::format("rank {} of {} holds {} values, but its shard of the {} parameters is [{}, {}) ({} "
                    "values: geoloco.shard_range)",
                    rank_, ranks_, held, total_, shard_.offset, shard_.end(), shard_.count));
  for (auto& o : offsets_) o += shard_.offset;  // the tensors hold [offset, end) of the flat values
  if (!in_place_) shard_buf_.resize(static_cast<size_t>(shard_.count));
}

// Calls fn(tensor, offset in the tensor, offset in [begin, begin + n), count) for every
// tensor's part of the flat values [begin, begin + n).
template <typename Fn>
void HostSite::walk(int64_t begin, int64_t n, Fn&& fn) const {
  if (n <= 0) return;
  const int64_t end = begin + n;
  auto it = std::upper_bound(offsets_.begin(), offsets_.end(), begin);
  for (size_t i = static_cast<size_t>(it - offsets_.begin()) - 1; i < tensors_.size() && offsets_[i] < end; ++i) {
    const int64_t lo = std::max(begin, offsets_[i]), hi = std::min(end, offsets_[i] + tensors_[i].numel);
    fn(tensors_[i].data + (lo - offsets_[i]), lo - begin, hi - lo);
  }
}

void HostSite::read(int64_t begin, std::span<float> out) const {
  walk(begin, static_cast<int64_t>(out.size()), [&](const float* t, int64_t at, int64_t count) {
    std::memcpy(out.data() + at, t, size_t(count) * sizeof(float));
  });
}

void HostSite::write(int64_t begin, std::span<const float> in) {
  walk(begin, static_cast<int64_t>(in.size()),
       [&](float* t, int64_t at, int64_t count) { std::memcpy(t, in.data() + at, size_t(count) * sizeof(float)); });
}

std::span<float> HostSite::shard_params() {
  if (in_place_) return {in_place_ + (shard_.offset - offsets_[0]), static_cast<size_t>(shard_.count)};
  if (cb_.stage_in) cb_.stage_in();
  read(shard_.offset, shard_buf_);
  return shard_buf_;
}

void HostSite::shard_updated() {
  const std::span<float> mine = in_place_ ? shard_params() : std::span<float>(shard_buf_);
  if (ranks_ == 1 || sharded_) {
    if (!in_place_) write(shard_.offset, mine);
  } else {
    // Every rank holds the whole model: each writes every rank's merged shard.
    const auto all = all_gather(std::as_bytes(std::span<const float>(mine)));
    for (int q = 0; q < ranks_; ++q) {
      const ShardRange r = shard_of(total_, q, ranks_);
      const auto& b = all[static_cast<size_t>(q)];
      if (static_cast<int64_t>(b.size()) != r.count * int64_t(sizeof(float)))
        throw Error(fmt::format("the site's all_gather returned {} bytes for rank {}'s shard of {} values", b.size(), q,
                                r.count));
      if (q != rank_ || !in_place_)
        write(r.offset, std::span<const float>(reinterpret_cast<const float*>(b.data()), size_t(r.count)));
    }
  }
  if (cb_.stage_out) cb_.stage_out();
}

void HostSite::reset_inner_state() {
  if (cb_.reset_inner_state) cb_.reset_inner_state();
}

std::vector<std::vector<std::byte>> HostSite::all_gather(std::span<const std::byte> mine) {
  if (ranks_ == 1) return Site::all_gather(mine);
  auto all = cb_.all_gather(mine);
  if (static_cast<int>(all.size()) != ranks_)
    throw Error(fmt::format("the site's all_gather returned {} parts for {} ranks", all.size(), ranks_));
  return all;
}

void HostSite::sum(std::span<double> values) {
  if (ranks_ == 1) return;
  const auto got = cb_.sum(std::vector<double>(values.begin(), values.end()));
  if (got.size() != values.size())
    throw Error(fmt::format("the site's sum returned {} values for {}", got.size(), values.size()));
  std::copy(got.begin(), got.end(), values.begin());
}

}  // namespace geoloco::python

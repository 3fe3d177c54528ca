// The pieces every site's shards cut the parameters into, and who owns each (exchange_layout.hpp).
#include "outer_optimizer/exchange_layout.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.hpp"

namespace geoloco::outer {

ExchangeLayout::ExchangeLayout(int64_t n, std::vector<int> ranks) : n_(n), ranks_(std::move(ranks)) {
  if (n_ < 0) throw Error(fmt::format("exchange layout: {} elements", n_));
  if (ranks_.empty()) throw Error("exchange layout: no site");
  for (size_t s = 0; s < ranks_.size(); ++s) {
    if (ranks_[s] < 1) throw Error(fmt::format("exchange layout: site {} has {} ranks", s, ranks_[s]));
    if (ranks_[s] != ranks_[0]) uniform_ = false;
  }
  std::vector<int64_t> cuts = {0, n_};
  for (int s = 0; s < sites(); ++s)
    for (int r = 1; r < ranks_[static_cast<size_t>(s)]; ++r) cuts.push_back(shard(s, r).offset);
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    Piece p;
    p.index = static_cast<uint32_t>(pieces_.size());
    p.begin = cuts[i];
    p.end = cuts[i + 1];
    for (int s = 0; s < sites(); ++s) p.owner.push_back(owner_of(s, p.begin));
    pieces_.push_back(std::move(p));
  }
}

ShardRange ExchangeLayout::shard(int site, int rank) const { return shard_of(n_, rank, ranks(site)); }

int ExchangeLayout::owner_of(int site, int64_t element) const {
  // Shards tile [0, n) in rank order: the last rank whose shard starts at or before it (and is
  // not empty -- empty shards sit at the end, past every element).
  const int R = ranks(site);
  int lo = 0, hi = R - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    const auto sh = shard(site, mid);
    if (sh.count > 0 && sh.offset <= element)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

std::vector<uint32_t> ExchangeLayout::pieces_of(int site, int rank) const {
  const auto sh = shard(site, rank);
  std::vector<uint32_t> out;
  for (const auto& p : pieces_)
    if (p.begin >= sh.offset && p.end <= sh.end()) out.push_back(p.index);
  return out;
}

std::vector<int> ExchangeLayout::linked_ranks(int site, int rank, int other) const {
  std::vector<int> out;
  for (uint32_t i : pieces_of(site, rank)) {
    const int q = pieces_[i].owner.at(static_cast<size_t>(other));
    if (out.empty() || out.back() != q) out.push_back(q);
  }
  return out;
}

int ExchangeLayout::partner(int site, int rank, int other) const {
  if (uniform_) return rank;
  const auto sh = shard(site, rank);
  if (n_ == 0) return 0;
  return owner_of(other, sh.count > 0 ? sh.offset : n_ - 1);
}

bool ExchangeLayout::mutual(int site, int rank, int other) const {
  return partner(other, partner(site, rank, other), site) == rank;
}

}  // namespace geoloco::outer

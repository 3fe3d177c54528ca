// ExchangeLayout: which part of the parameters each rank exchanges with which rank of every
// other site, when sites shard the model over different rank counts (docs/shapes.md).
//
// Every site shards the flat parameter buffer of n elements over its own ranks
// (shard_of). The pieces are the common refinement of every site's shard
// boundaries: each piece lies inside exactly one shard of every site, so it has one owner
// rank per site. A rank exchanges each piece of its shard with that piece's owner at every
// other site -- its pseudo-gradient frame and the cross-site hash of the piece, keyed on the
// wire by the piece's index -- so every site decodes the same bytes for every element and
// computes bit-identical global weights whatever its own rank count.
//
// When every site has the same rank count the pieces are the shards, piece r is rank r's,
// and the exchange is rank r with rank r of every site, frame for frame as before.
// Pure arithmetic on the config: every rank of every site computes the same layout.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/shard.hpp"

namespace geoloco::outer {

struct Piece {
  uint32_t index = 0;
  int64_t begin = 0, end = 0;  // [begin, end) of the flat parameter buffer
  std::vector<int> owner;      // by site: the rank whose shard holds it
  int64_t size() const { return end - begin; }
};

class ExchangeLayout {
 public:
  // `n` elements sharded over ranks[s] ranks at site s. Throws Error for n < 0, no site or a
  // site of fewer than one rank.
  ExchangeLayout(int64_t n, std::vector<int> ranks);

  int64_t elements() const { return n_; }
  int sites() const { return static_cast<int>(ranks_.size()); }
  int ranks(int site) const { return ranks_.at(static_cast<size_t>(site)); }
  // Every site has the same rank count (pieces are shards).
  bool uniform() const { return uniform_; }
  const std::vector<Piece>& pieces() const { return pieces_; }
  ShardRange shard(int site, int rank) const;
  // The indices of the pieces inside (site, rank)'s shard, ascending (none for an empty shard).
  std::vector<uint32_t> pieces_of(int site, int rank) const;
  // The ranks of `other` whose shards overlap (site, rank)'s, ascending.
  std::vector<int> linked_ranks(int site, int rank, int other) const;
  // The rank of `other` (site, rank) sends its control messages to: the owner of its shard's
  // first element (for an empty shard, of the buffer's last element). Rank 0 of every site is
  // rank 0's partner; with uniform sites rank r's is rank r.
  int partner(int site, int rank, int other) const;
  // Whether (site, rank) and its partner at `other` are each other's partners.
  bool mutual(int site, int rank, int other) const;

 private:
  int owner_of(int site, int64_t element) const;
  int64_t n_;
  std::vector<int> ranks_;
  bool uniform_ = true;
  std::vector<Piece> pieces_;
};

}  // namespace geoloco::outer

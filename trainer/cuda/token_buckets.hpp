// TokenBuckets: the rows of a batch grouped by token id, for the wte gradient.
//
// d(wte)[tok] is the sum of d(encoded)[n] over the rows n whose input id is tok. Summing on
// the GPU without atomics (determinism) needs each output row's inputs listed; the ids are on
// the host before every forward anyway, so a counting sort there (O(N + vocab)) gives:
//
//   rows    [N]       row indices grouped by token, ascending inside a group
//   starts  [n + 1]   group g is rows[starts[g], starts[g+1])
//   tokens  [n]       the token id of group g (ascending)
//
// Rows stay in ascending order inside a group, so a kernel that adds them in that order into
// the token's row reproduces a sequential walk over n = 0..N-1 bit for bit (the CPU
// reference's order). All three arrays are packed into one int32 array (one upload).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace geoloco::cuda {

class TokenBuckets {
 public:
  // ids: N token ids, each in [0, vocab) (the caller has validated them; out-of-range ids
  // throw InputError naming the position).
  void build(std::span<const int32_t> ids, int vocab);

  int64_t rows() const { return n_rows_; }   // N
  int64_t groups() const { return n_groups_; }  // distinct ids
  // [rows | starts | tokens], 2N + 1 + groups() int32 values; offsets below.
  std::span<const int32_t> packed() const { return {packed_.data(), packed_.size()}; }
  int64_t starts_offset() const { return n_rows_; }
  int64_t tokens_offset() const { return 2 * n_rows_ + 1; }
  // An upper bound of packed().size() for N rows (to size buffers before building).
  static int64_t max_packed(int64_t n_rows) { return 3 * n_rows + 1; }

 private:
  std::vector<int32_t> count_;  // vocab counters, kept between calls (reused, not reallocated)
  std::vector<int32_t> packed_;
  int64_t n_rows_ = 0, n_groups_ = 0;
};

}  // namespace geoloco::cuda

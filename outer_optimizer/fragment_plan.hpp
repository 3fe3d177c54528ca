// Streaming fragments (outer.fragments = F): the parameters are split into F fragments,
// each synchronized at its own offset within every H-step period, so the WAN carries a
// steady stream of F smaller transfers instead of one burst every H steps.
//
// Partition of the model's named tensors (site.hpp's ModelParams; every parameter in exactly
// one fragment; tests/outer_optimizer FragmentPlan.*):
//   - the tensors of block l go to fragment l mod F: blocks are strided over depth, so every
//     fragment spans the whole model (shallow and deep layers);
//   - a matrix outside the blocks (an embedding table, an untied head) is cut into F chunks of
//     whole rows, chunk f to fragment f (they are large: GPT-2's wte alone is 5x a block);
//   - the vectors outside the blocks (a final norm: GPT-2's ln_f, 2C floats) go together to
//     the fragment that is smallest at that point.
// Fragment f syncs at the steps s > 0 with s mod H == ((f + 1) * H / F) mod H: evenly
// staggered, fragment F-1 at the multiples of H. With F = 1 that is the plain schedule.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/shard.hpp"
#include "outer_optimizer/site.hpp"

namespace geoloco::outer {

struct Range {
  int64_t begin = 0, end = 0;  // [begin, end), in floats
  int64_t size() const { return end - begin; }
  bool operator==(const Range&) const = default;
};

struct FragmentPlan {
  int index = 0;
  int64_t offset = 0;         // sync steps: s > 0 with s % interval == offset
  std::vector<Range> ranges;  // into the flat parameter buffer, sorted, disjoint, merged
  std::vector<int> blocks;    // the blocks it holds (for logs and docs)
  int64_t elements() const;
  std::string describe() const;  // "fragment 1: blocks 1,3 + wte rows 128..255 (123456 params)"
};

// Throws ConfigError when F < 1, F > the model's blocks or F > interval.
std::vector<FragmentPlan> plan_fragments(const ModelParams& params, int fragments, int64_t interval);

// The part of `ranges` inside `shard`, as offsets relative to shard.offset (sorted, disjoint).
std::vector<Range> intersect(const std::vector<Range>& ranges, ShardRange shard);

// Whether fragment `plan` syncs after inner step `step` (> 0) of a run with this interval.
bool syncs_at(const FragmentPlan& plan, int64_t step, int64_t interval);

}  // namespace geoloco::outer

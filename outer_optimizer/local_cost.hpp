// The outer loop's own cost of a sync, outside the network: encode (with error feedback where
// outer.plan: auto would switch it on), decode of every site's frame and their weighted sum,
// and the passes of the pseudo-gradient, the outer step and the copy back -- timed on this
// host on a sample and scaled to this rank's shard. outer.plan: auto adds it to each
// fragment sync's predicted time (the budget model's local_sync_s), per codec bit width:
// before it, the plan saw only the network and a 254M rehearsal's syncs took 3x the
// prediction on a 2-core host (docs/rehearsal.md).
#pragma once

#include <cstddef>
#include <map>
#include <vector>

#include "compression/config.hpp"

namespace geoloco::outer {

// Seconds per sync of `elements` (this rank's shard) by bit width in `bits`, for `sites`
// frames decoded per sync; `base` gives block, zstd and threads (its codec is replaced).
// Times min(elements, `sample`) elements (at least 65536), best of two runs.
std::map<int, double> measure_local_sync_s(const compression::PipelineConfig& base, const std::vector<int>& bits,
                                           int sites, size_t elements, size_t sample = size_t{1} << 21);

}  // namespace geoloco::outer

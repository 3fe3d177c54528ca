// Global-norm gradient clipping. The norm is accumulated in double, in a fixed order, so
// it is deterministic for a given buffer (sharded callers all-reduce the squared sums).
#pragma once

#include <span>

namespace geoloco::trainer {

// Sum of squares of `g` (double accumulation, fixed blocked order).
double sum_of_squares(std::span<const float> g);

// Scales `g` so that its norm is at most max_norm, given the precomputed global norm.
// Returns the scale applied (1 when no clipping). max_norm <= 0 disables clipping.
float clip_to_norm(std::span<float> g, double global_norm, double max_norm);

}  // namespace geoloco::trainer

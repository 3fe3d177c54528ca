// Synthetic pseudo-gradients for tests and benchmarks when no captured ones are at hand.
// Real DiLoCo pseudo-gradients (theta_start - theta_after_H_steps) are heavy-tailed and
// their magnitude varies strongly between tensors and rows, so: Student-t (nu = 3) values
// times a log-normal scale (sigma = 1) per run of `row` elements, times `base`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace geoloco::compression {

std::vector<float> synthetic_pseudo_gradient(size_t elements, uint64_t seed, size_t row = 768,
                                             double base = 1e-3);

}  // namespace geoloco::compression

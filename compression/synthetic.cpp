#include "compression/synthetic.hpp"

#include <cmath>

#include "core/rng.hpp"

namespace geoloco::compression {

std::vector<float> synthetic_pseudo_gradient(size_t elements, uint64_t seed, size_t row, double base) {
  std::vector<float> v(elements);
  Rng rng(seed);
  double scale = base;
  for (size_t i = 0; i < elements; ++i) {
    if (i % row == 0) scale = base * std::exp(rng.normal());
    // Student-t with 3 degrees of freedom: Z / sqrt(chi2_3 / 3).
    const double z = rng.normal();
    const double a = rng.normal(), b = rng.normal(), c = rng.normal();
    const double t = z / std::sqrt((a * a + b * b + c * c) / 3.0 + 1e-300);
    v[i] = static_cast<float>(scale * t);
  }
  return v;
}

}  // namespace geoloco::compression

#include "trainer/cuda/precision.hpp"

#include "core/error.hpp"

namespace geoloco::cuda {

Precision parse_precision(std::string_view s) {
  if (s == "fp32") return Precision::Fp32;
  if (s == "bf16") return Precision::Bf16;
  throw ConfigError(fmt::format("precision '{}' is not supported: choose fp32 or bf16", s));
}

const char* precision_name(Precision p) { return p == Precision::Fp32 ? "fp32" : "bf16"; }

int activation_bytes(Precision p) { return p == Precision::Fp32 ? 4 : 2; }

}  // namespace geoloco::cuda

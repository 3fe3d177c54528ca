// Compute precision of the CUDA backend (`train.precision` in the run config).
//   fp32: every op in float, cuBLAS with CUBLAS_COMPUTE_32F (no TF32), the parity baseline.
//   bf16: activations and GEMM operands in bfloat16 with fp32 accumulation; fp32 master
//         weights, fp32 gradients, fp32 AdamW state, fp32 loss (mixed precision).
#pragma once

#include <string>
#include <string_view>

namespace geoloco::cuda {

enum class Precision { Fp32, Bf16 };

// "fp32" | "bf16"; throws ConfigError naming the value and the choices otherwise.
Precision parse_precision(std::string_view s);
const char* precision_name(Precision p);
// Bytes of one activation element.
int activation_bytes(Precision p);

}  // namespace geoloco::cuda

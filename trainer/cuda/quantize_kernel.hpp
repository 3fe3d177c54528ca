// Quantization of the outer loop's scaled codecs on the device: the per-group fp32 scales and
// the packed codes of compression::encode_values (int8, int4, fp4, int2), bit for bit, and the
// error-feedback steps around them (the corrected input, the residual against what receivers
// decode). Built so that a CUDA site can stage compressed bytes instead of fp32 (issue "the
// real outer loop at real model size"): a CUDA site's outer loop calls them through
// trainer/loop/cuda_outer_stage.hpp (outer.quantize_on). Tested on the CUDA emulator against the
// CPU codec (tests/trainer/cuda/test_quantize_kernel.cpp).
//
// Layout (compression/values.hpp): groups of `group` elements (the last may be shorter), one
// fp32 scale each; codes bit-packed back to back, low bits first, zero padding. All pointers
// are device pointers; every launch is asynchronous on `s`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace geoloco::cuda {

enum class QuantCodec : uint8_t { kInt8, kInt4, kFp4, kInt2 };

int quant_bits(QuantCodec c);
inline size_t quant_groups(size_t n, size_t group) { return (n + group - 1) / group; }
inline size_t quant_code_bytes(size_t n, QuantCodec c) { return (n * static_cast<size_t>(quant_bits(c)) + 7) / 8; }

// x: n finite values with |x| <= 2^64 (the caller checks, as the CPU encoder's caller does).
// Writes scales (quant_groups floats), codes (quant_code_bytes bytes) and q (n bytes, one code
// per element, what launch_ef_residual reads); `inv` (quant_groups floats) is scratch.
void launch_quantize(QuantCodec c, const float* x, size_t n, size_t group, float* scales, uint8_t* codes, float* inv,
                     uint8_t* q, cudaStream_t s);

// Error feedback, as compression::Pipeline does it: corrected = values + residual (beta < 1:
// values + beta * residual) ...
void launch_ef_correct(const float* values, const float* residual, float beta, float* corrected, size_t n,
                       cudaStream_t s);
// ... and after quantizing `corrected`: residual = corrected - decode(scales, q), from the
// one-byte codes `q` launch_quantize left.
void launch_ef_residual(QuantCodec c, const float* corrected, const float* scales, const uint8_t* q, size_t n,
                        size_t group, float* residual, cudaStream_t s);

// The round's pseudo-gradient of one run of elements: out[i] = global[i] - local[i] (one
// rounding, as the host's f.global[i] - local[i]).
void launch_pseudo_gradient(const float* global, const float* local, float* out, size_t n, cudaStream_t s);

// The merge after an outer step: local[i] = alpha * local[i] + (1 - alpha) * global[i], each
// product and the sum rounded on their own (the host's contraction-free loop), or with
// `copy`: local[i] = global[i].
void launch_merge(float* local, const float* global, float alpha, bool copy, size_t n, cudaStream_t s);

// The error figures of one quantized run: with d = delta[i] and e = decode(scales, q)[i] - d,
// per block b of a fixed grid of kErrorBlocks: partial[3b] = sum e^2, partial[3b+1] = sum d^2
// (doubles), partial[3b+2] = the count of `corrected` values the CPU encoder would refuse
// (non-finite, or |x| > 2^64). Sum the blocks on the host (sum_error_partials).
constexpr unsigned kErrorBlocks = 64;
void launch_error_partials(QuantCodec c, const float* delta, const float* corrected, const float* scales,
                           const uint8_t* q, size_t n, size_t group, double* partial, cudaStream_t s);
struct ErrorSums {
  double err2 = 0, ref2 = 0, refused = 0;
};
ErrorSums sum_error_partials(const double* partial);

}  // namespace geoloco::cuda

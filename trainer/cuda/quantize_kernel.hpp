// Quantization of the outer loop's scaled codecs on the device: the per-group fp32 scales and
// the packed codes of compression::encode_values (int8, int4, fp4, int2), bit for bit, and the
// error-feedback steps around them (the corrected input, the residual against what receivers
// decode). Built so that a CUDA site can stage compressed bytes instead of fp32 (issue "the
// real outer loop at real model size"); the outer loop does not call them yet. Tested on the
// CUDA emulator against the CPU codec (tests/cuda/test_quantize_kernel.cpp).
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

}  // namespace geoloco::cuda

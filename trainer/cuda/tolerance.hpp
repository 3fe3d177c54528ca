// Op-parity tolerances: how far a CUDA op may be from the CPU reference, per op and
// precision, measured by the relative L2 error ||got - want|| / ||want|| over the whole
// output tensor (one number per tensor; a few large elementwise differences in a tensor
// of small values still show, and a tensor of zeros compares exactly).
//
// Why these figures: fp32 ops differ from the double-accumulating reference only by float
// rounding and summation order (cuBLAS blocks its sums), a few 1e-7 per element growing with
// the reduction length, so 1e-5 leaves margin without hiding a wrong index. bf16 keeps 8
// mantissa bits (unit roundoff 2^-9 ~ 2e-3); inputs and outputs are each rounded once and the
// GEMM operands again, so 1-3e-2 allows a few roundings but not a systematically wrong op.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "trainer/cuda/precision.hpp"

namespace geoloco::cuda {

struct ErrorStats {
  double rel_l2 = 0;    // ||got - want||_2 / ||want||_2 (0 when both are all zero; inf when only want is)
  double max_abs = 0;   // max |got - want|
  int64_t count = 0;
  bool finite = true;   // false when got holds a NaN or an infinity
};

// Throws Error when the sizes differ.
ErrorStats compare(std::span<const float> got, std::span<const float> want);

struct OpTolerance {
  const char* op;
  double fp32;
  double bf16;
};

// Every op the parity test checks, plus "model.loss", "model.grads" (whole model) and
// "train.loss" (loss-curve tracking over a short run).
std::span<const OpTolerance> tolerance_table();
// Throws Error for an op that is not in the table (a typo in a test must not pass).
double tolerance(std::string_view op, Precision p);
bool within(const ErrorStats& s, double tol);

}  // namespace geoloco::cuda

#include "trainer/optim/muon.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>

#include "core/error.hpp"

namespace geoloco::trainer {

std::vector<MuonMatrix> muon_matrices(const ParamLayout& layout) {
  std::vector<MuonMatrix> out;
  for (const auto& v : layout.views())
    if (v.kind == ParamKind::LinearWeight && v.shape.size() == 2) out.push_back({v.offset, v.shape[0], v.shape[1]});
  return out;
}

float muon_scale(int64_t rows, int64_t cols, MuonScale scale) {
  const double r = static_cast<double>(rows), c = static_cast<double>(cols);
  if (scale == MuonScale::Rms) return static_cast<float>(0.2 * std::sqrt(std::max(r, c)));
  return static_cast<float>(std::sqrt(std::max(1.0, c / r)));  // [in, out]: out / in, as torch's rows / cols
}

void newton_schulz(std::span<float> x, int64_t rows, int64_t cols, int steps, std::vector<float>& scratch) {
  GEOLOCO_CHECK(rows > 0 && cols > 0 && static_cast<int64_t>(x.size()) == rows * cols,
                "newton_schulz: {} floats for a {} x {} matrix", x.size(), rows, cols);
  const bool wide = rows <= cols;  // A = X X^T (rows x rows), else A = X^T X (cols x cols)
  const int64_t m = wide ? rows : cols, n = rows * cols;
  scratch.resize(static_cast<size_t>(2 * m * m + n));
  float* A = scratch.data();
  float* B = A + m * m;
  float* Y = B + m * m;
  double sq = 0;
  for (float v : x) sq += static_cast<double>(v) * v;
  const float inv = static_cast<float>(1.0 / (std::sqrt(sq) + 1e-7));
  for (auto& v : x) v *= inv;
  const int R = static_cast<int>(rows), C = static_cast<int>(cols), M = static_cast<int>(m);
  float* X = x.data();
  for (int s = 0; s < steps; ++s) {
    if (wide)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, M, C, 1.0f, X, C, X, C, 0.0f, A, M);
    else
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, M, M, R, 1.0f, X, C, X, C, 0.0f, A, M);
    // B = b A + c A A
    std::copy(A, A + m * m, B);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, M, M, kNsC, A, M, A, M, kNsB, B, M);
    // Y = a X + B X (wide) or a X + X B (tall; B is symmetric)
    for (int64_t i = 0; i < n; ++i) Y[i] = kNsA * X[i];
    if (wide)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, R, C, R, 1.0f, B, M, X, C, 1.0f, Y, C);
    else
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, R, C, C, 1.0f, X, C, B, M, 1.0f, Y, C);
    std::copy(Y, Y + n, X);
  }
}

}  // namespace geoloco::trainer

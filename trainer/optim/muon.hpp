// Muon's parts that do not depend on where the numbers live: which tensors are its matrices,
// the Newton-Schulz orthogonalization (CPU, fp32 through BLAS), and the update's scale.
//
// Muon (Keller Jordan, 2024): keep a momentum of the gradient of each 2-D weight matrix and
// step along its orthogonalization, the nearest semi-orthogonal matrix U V^T of G = U S V^T,
// approximated by five iterations of the quintic X <- a X + (b A + c A A) X, A = X X^T, with
// (a, b, c) = (3.4445, -4.7750, 2.0315), started from X = G / (|G|_F + 1e-7). The iteration
// takes every singular value into roughly [0.7, 1.2] (it is tuned for speed, not exactness).
// Orthogonalizing W^T gives the transpose of orthogonalizing W, so the HF [in, out] storage
// needs no transpose.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "trainer/model/param_layout.hpp"
#include "trainer/optim/optimizer_config.hpp"

namespace geoloco::trainer {

inline constexpr float kNsA = 3.4445f, kNsB = -4.7750f, kNsC = 2.0315f;

struct MuonMatrix {
  int64_t offset = 0;          // in floats, into the flat layout
  int64_t rows = 0, cols = 0;  // as stored: [in, out]
  int64_t end() const { return offset + rows * cols; }
};

// The transformer blocks' linear weights (attention qkv and projection, MLP up and down), in
// layout order. Embeddings (wte, which is also the tied LM head, and wpe), biases and
// LayerNorm stay with AdamW.
std::vector<MuonMatrix> muon_matrices(const ParamLayout& layout);

// The scale applied to an orthogonalized [rows, cols] update.
float muon_scale(int64_t rows, int64_t cols, MuonScale scale);

// x (row-major rows x cols) <- its Newton-Schulz orthogonalization after `steps` iterations,
// in fp32 with cblas_sgemm; `scratch` grows as needed and may be reused across calls.
void newton_schulz(std::span<float> x, int64_t rows, int64_t cols, int steps, std::vector<float>& scratch);

}  // namespace geoloco::trainer

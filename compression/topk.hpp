// Top-k sparsification per block: which values each block keeps, and the compact index
// section that tells the receiver where they go (layout in compression/frame.hpp).
//
// Selection is deterministic: the largest |x| first, ties broken by the lower index, so
// every site (and every rerun) picks the same set from the same bits.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "compression/frame.hpp"

namespace geoloco::compression {

// Writes the index section (layout.index_bytes bytes) and the kept values in ascending index
// order, block after block, to `kept` (layout.kept values).
// Blocks [b0, b1) only (b1 0: to the last block): what they write is theirs alone (their
// index bytes, their kept values), so block ranges may run on several threads.
void topk_select(std::span<const float> x, const PayloadLayout& layout, uint32_t block, uint8_t* index, float* kept,
                 std::vector<uint32_t>& scratch, uint64_t b0 = 0, uint64_t b1 = 0);

// Reads the index section and writes out[i] = kept value for kept positions, 0 elsewhere
// (out.size() == elements). Throws FrameError(kPayload) for indices out of range or not
// strictly ascending, a bitmap whose population differs from the kept count, or non-zero
// padding bits.
// Blocks [b0, b1) only, as topk_select.
void topk_scatter(const uint8_t* index, const PayloadLayout& layout, uint32_t block, const float* kept,
                  std::span<float> out, uint64_t b0 = 0, uint64_t b1 = 0);

}  // namespace geoloco::compression

#include "compression/topk.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstring>

namespace geoloco::compression {
namespace {

// Writes fixed-width fields low bits first into a zeroed byte area.
class BitWriter {
 public:
  explicit BitWriter(uint8_t* out) : out_(out) {}
  void put(uint32_t value, int width) {
    acc_ |= static_cast<uint64_t>(value) << fill_;
    fill_ += width;
    while (fill_ >= 8) {
      *out_++ = static_cast<uint8_t>(acc_);
      acc_ >>= 8;
      fill_ -= 8;
    }
  }
  void flush() {
    if (fill_ > 0) *out_++ = static_cast<uint8_t>(acc_);
  }

 private:
  uint8_t* out_;
  uint64_t acc_ = 0;
  int fill_ = 0;
};

class BitReader {
 public:
  BitReader(const uint8_t* in, size_t bytes) : in_(in), end_(in + bytes) {}
  uint32_t get(int width) {
    while (fill_ < width) {
      // The caller sized the area from the layout, so this never runs past `end_`; the
      // check keeps a layout bug from becoming an out-of-bounds read.
      if (in_ == end_) throw FrameError(FrameFault::kPayload, "index section overrun");
      acc_ |= static_cast<uint64_t>(*in_++) << fill_;
      fill_ += 8;
    }
    const uint32_t v = static_cast<uint32_t>(acc_ & ((uint64_t{1} << width) - 1));
    acc_ >>= width;
    fill_ -= width;
    return v;
  }
  // Bits left in the last byte read must be zero padding.
  bool padding_clear() const { return acc_ == 0 && in_ == end_; }

 private:
  const uint8_t* in_;
  const uint8_t* end_;
  uint64_t acc_ = 0;
  int fill_ = 0;
};

struct BlockGeometry {
  uint64_t begin;
  uint32_t len;
  uint32_t kept;
  bool bitmap;
  uint64_t index_offset;
  uint64_t index_bytes;
  uint64_t kept_offset;
};

BlockGeometry geometry(const PayloadLayout& l, uint32_t block, uint64_t b) {
  const bool last = b + 1 == l.blocks;
  return BlockGeometry{b * block,
                       last ? l.last_len : block,
                       last ? l.kept_last : l.kept_full,
                       last ? l.bitmap_last : l.bitmap_full,
                       b * l.index_bytes_full,
                       last ? l.index_bytes_last : l.index_bytes_full,
                       b * l.kept_full};
}

}  // namespace

// Number of magnitudes >= t: a branch-free counting loop the compiler vectorizes.
static uint32_t count_at_least(const uint32_t* __restrict mag, uint32_t n, uint32_t t) {
  uint32_t c = 0;
  for (uint32_t i = 0; i < n; ++i) c += mag[i] >= t ? 1u : 0u;
  return c;
}

void topk_select(std::span<const float> x, const PayloadLayout& l, uint32_t block, uint8_t* index, float* kept,
                 std::vector<uint32_t>& scratch, uint64_t b0, uint64_t b1) {
  if (b1 == 0 || b1 > l.blocks) b1 = l.blocks;
  if (b0 >= b1) return;
  if (l.index_bytes) {
    const BlockGeometry first = geometry(l, block, b0), last = geometry(l, block, b1 - 1);
    std::memset(index + first.index_offset, 0, last.index_offset + last.index_bytes - first.index_offset);
  }
  scratch.resize(2 * static_cast<size_t>(block));
  uint32_t* mag = scratch.data();
  uint32_t* pos = scratch.data() + block;
  for (uint64_t b = b0; b < b1; ++b) {
    const BlockGeometry g = geometry(l, block, b);
    const float* xb = x.data() + g.begin;
    // |x| as bits: orders finite magnitudes exactly.
    for (uint32_t i = 0; i < g.len; ++i) mag[i] = std::bit_cast<uint32_t>(xb[i]) & 0x7fffffffu;
    uint32_t count = 0;
    if (g.kept == g.len) {
      for (uint32_t i = 0; i < g.len; ++i) pos[count++] = i;
    } else {
      // Threshold T = the kept-th largest magnitude: the largest t with at least `kept`
      // magnitudes >= t, by bisection over the 31-bit magnitude space (31 vectorized counts
      // per block instead of a selection sort). Everything above T is kept; ties at T go to
      // the lowest indices, so the choice is a pure function of the input bits.
      uint32_t lo = 0, hi = 0x80000000u;  // count(>= lo) >= kept, count(>= hi) < kept
      while (hi - lo > 1) {
        const uint32_t mid = lo + (hi - lo) / 2;
        if (count_at_least(mag, g.len, mid) >= g.kept)
          lo = mid;
        else
          hi = mid;
      }
      uint32_t ties = g.kept - count_at_least(mag, g.len, lo + 1);
      for (uint32_t i = 0; i < g.len; ++i) {
        const bool take = mag[i] > lo || (mag[i] == lo && ties > 0);
        if (mag[i] == lo && take) --ties;
        if (take) pos[count++] = i;
      }
    }
    uint8_t* ib = index + g.index_offset;
    if (g.bitmap) {
      for (uint32_t j = 0; j < count; ++j) ib[pos[j] / 8] |= static_cast<uint8_t>(1u << (pos[j] % 8));
    } else {
      BitWriter w(ib);
      for (uint32_t j = 0; j < count; ++j) w.put(pos[j], l.index_width);
      w.flush();
    }
    float* kout = kept + g.kept_offset;
    for (uint32_t j = 0; j < count; ++j) kout[j] = xb[pos[j]];
  }
}

void topk_scatter(const uint8_t* index, const PayloadLayout& l, uint32_t block, const float* kept, std::span<float> out,
                  uint64_t b0, uint64_t b1) {
  if (b1 == 0 || b1 > l.blocks) b1 = l.blocks;
  if (b0 >= b1) return;
  {
    const BlockGeometry first = geometry(l, block, b0), last = geometry(l, block, b1 - 1);
    std::fill(out.begin() + static_cast<std::ptrdiff_t>(first.begin),
              out.begin() + static_cast<std::ptrdiff_t>(last.begin + last.len), 0.0f);
  }
  for (uint64_t b = b0; b < b1; ++b) {
    const BlockGeometry g = geometry(l, block, b);
    const uint8_t* ib = index + g.index_offset;
    const float* kin = kept + g.kept_offset;
    float* ob = out.data() + g.begin;
    if (g.bitmap) {
      uint32_t count = 0;
      for (uint32_t byte = 0; byte < g.index_bytes; ++byte) {
        unsigned bits = ib[byte];
        const uint32_t base = byte * 8;
        if (base + 8 > g.len && (bits >> (g.len - base)) != 0)
          throw FrameError(FrameFault::kPayload,
                           fmt::format("block {}: bitmap marks positions past the block length {}", b, g.len));
        while (bits) {
          const uint32_t pos = base + static_cast<uint32_t>(std::countr_zero(bits));
          bits &= bits - 1;
          if (count == g.kept)
            throw FrameError(FrameFault::kPayload,
                             fmt::format("block {}: bitmap marks more than {} kept values", b, g.kept));
          ob[pos] = kin[count++];
        }
      }
      if (count != g.kept)
        throw FrameError(FrameFault::kPayload,
                         fmt::format("block {}: bitmap marks {} values, the frame keeps {}", b, count, g.kept));
    } else {
      BitReader r(ib, g.index_bytes);
      int64_t prev = -1;
      for (uint32_t j = 0; j < g.kept; ++j) {
        const uint32_t pos = r.get(l.index_width);
        if (pos >= g.len || static_cast<int64_t>(pos) <= prev)
          throw FrameError(FrameFault::kPayload,
                           fmt::format("block {}: kept index {} after {} (block length {}): out of range or "
                                       "not ascending",
                                       b, pos, prev, g.len));
        prev = pos;
        ob[pos] = kin[j];
      }
      if (!r.padding_clear())
        throw FrameError(FrameFault::kPayload, fmt::format("block {}: non-zero padding after the indices", b));
    }
  }
}

}  // namespace geoloco::compression

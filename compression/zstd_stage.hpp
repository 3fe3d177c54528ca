// zstd stage of the pipeline: RAII owners of the zstd contexts (one of each per Pipeline,
// reused across frames so no per-frame allocation).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

struct ZSTD_CCtx_s;
struct ZSTD_DCtx_s;

namespace geoloco::compression {

class ZstdCompressor {
 public:
  explicit ZstdCompressor(int level);
  // Compresses `in` into one zstd frame in `out` (capacity at least zstd_bound(in.size())),
  // whatever its size; returns it.
  size_t compress_frame(std::span<const uint8_t> in, std::span<uint8_t> out);
  int level() const { return level_; }

 private:
  struct Free {
    void operator()(ZSTD_CCtx_s* c) const;
  };
  std::unique_ptr<ZSTD_CCtx_s, Free> ctx_;
  int level_;
};

class ZstdDecompressor {
 public:
  ZstdDecompressor();
  // Decompresses exactly one zstd frame that fills `out` exactly. The declared content size
  // must equal out.size() and the compressed frame must span all of `in`; anything else
  // throws FrameError(kZstd). Never writes past `out`.
  void decompress(std::span<const uint8_t> in, std::span<uint8_t> out);

 private:
  struct Free {
    void operator()(ZSTD_DCtx_s* c) const;
  };
  std::unique_ptr<ZSTD_DCtx_s, Free> ctx_;
};

// Worst-case compressed size of `raw` bytes (ZSTD_compressBound).
size_t zstd_bound(size_t raw);
// The size of the zstd frame that starts `in` (it may be followed by others); FrameError(kZstd)
// when `in` does not start with a whole zstd frame.
size_t zstd_frame_size(std::span<const uint8_t> in);

}  // namespace geoloco::compression

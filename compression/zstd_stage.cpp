#include "compression/zstd_stage.hpp"

#include <fmt/format.h>
#include <zstd.h>

#include "compression/frame.hpp"

namespace geoloco::compression {

void ZstdCompressor::Free::operator()(ZSTD_CCtx_s* c) const { ZSTD_freeCCtx(c); }
void ZstdDecompressor::Free::operator()(ZSTD_DCtx_s* c) const { ZSTD_freeDCtx(c); }

size_t zstd_bound(size_t raw) { return ZSTD_compressBound(raw); }

size_t zstd_frame_size(std::span<const uint8_t> in) {
  const size_t n = ZSTD_findFrameCompressedSize(in.data(), in.size());
  if (ZSTD_isError(n)) throw FrameError(FrameFault::kZstd, fmt::format("zstd frame: {}", ZSTD_getErrorName(n)));
  return n;
}

ZstdCompressor::ZstdCompressor(int level) : ctx_(ZSTD_createCCtx()), level_(level) {
  if (!ctx_) throw Error("zstd: cannot create a compression context (out of memory)");
  // Pin everything that could vary between machines or library defaults so every site emits
  // the same bytes for the same input: a fixed level and single-threaded compression.
  size_t rc = ZSTD_CCtx_setParameter(ctx_.get(), ZSTD_c_compressionLevel, level);
  if (!ZSTD_isError(rc)) rc = ZSTD_CCtx_setParameter(ctx_.get(), ZSTD_c_checksumFlag, 0);  // frame has XXH3
  if (!ZSTD_isError(rc)) rc = ZSTD_CCtx_setParameter(ctx_.get(), ZSTD_c_contentSizeFlag, 1);
  if (ZSTD_isError(rc)) throw Error(fmt::format("zstd: level {}: {}", level, ZSTD_getErrorName(rc)));
}

size_t ZstdCompressor::compress_frame(std::span<const uint8_t> in, std::span<uint8_t> out) {
  const size_t rc = ZSTD_compress2(ctx_.get(), out.data(), out.size(), in.data(), in.size());
  if (ZSTD_isError(rc))
    throw Error(fmt::format("zstd: compressing {} bytes at level {}: {}", in.size(), level_, ZSTD_getErrorName(rc)));
  return rc;
}

ZstdDecompressor::ZstdDecompressor() : ctx_(ZSTD_createDCtx()) {
  if (!ctx_) throw Error("zstd: cannot create a decompression context (out of memory)");
  // Bound the window a hostile frame can make us allocate: payloads are at most a shard, and
  // 2^27 covers the levels 1..19 we emit (their window logs are <= 23).
  const size_t rc = ZSTD_DCtx_setParameter(ctx_.get(), ZSTD_d_windowLogMax, 27);
  if (ZSTD_isError(rc)) throw Error(fmt::format("zstd: {}", ZSTD_getErrorName(rc)));
}

void ZstdDecompressor::decompress(std::span<const uint8_t> in, std::span<uint8_t> out) {
  const unsigned long long declared = ZSTD_getFrameContentSize(in.data(), in.size());
  if (declared == ZSTD_CONTENTSIZE_ERROR) throw FrameError(FrameFault::kZstd, "payload is not a zstd frame");
  if (declared == ZSTD_CONTENTSIZE_UNKNOWN)
    throw FrameError(FrameFault::kZstd, "zstd frame does not declare its content size");
  if (declared != out.size())
    throw FrameError(FrameFault::kZstd,
                     fmt::format("zstd frame declares {} bytes, the header's raw_bytes is {}", declared, out.size()));
  const size_t frame_size = ZSTD_findFrameCompressedSize(in.data(), in.size());
  if (ZSTD_isError(frame_size))
    throw FrameError(FrameFault::kZstd, fmt::format("zstd frame: {}", ZSTD_getErrorName(frame_size)));
  if (frame_size != in.size())
    throw FrameError(FrameFault::kZstd,
                     fmt::format("zstd frame is {} bytes, the payload {} (trailing data)", frame_size, in.size()));
  const size_t rc = ZSTD_decompressDCtx(ctx_.get(), out.data(), out.size(), in.data(), in.size());
  if (ZSTD_isError(rc)) throw FrameError(FrameFault::kZstd, fmt::format("zstd: {}", ZSTD_getErrorName(rc)));
  if (rc != out.size())
    throw FrameError(FrameFault::kZstd, fmt::format("zstd produced {} bytes, expected {}", rc, out.size()));
}

}  // namespace geoloco::compression

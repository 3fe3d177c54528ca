// Writes the seed and malformed-frame corpus used by the fuzzer and by the corpus regression
// test (tests/compression/corpus):
//   valid/<config>.bin        frames every decoder must accept
//   malformed/<fault>-<what>.bin  frames that must fail with exactly <fault> (see fault_name)
// The malformed frames carry a correct checksum wherever the fault lies behind it, so each
// reaches the check it targets. Usage: compression_make_corpus <dir>
#include <fmt/format.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>

#include "compression/bytes.hpp"
#include "compression/pipeline.hpp"
#include "compression/synthetic.hpp"

using namespace geoloco::compression;
namespace fs = std::filesystem;

namespace {

void write(const fs::path& p, const std::vector<uint8_t>& b) {
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  if (!f) throw std::runtime_error("cannot write " + p.string());
}

void reseal(std::vector<uint8_t>& f) {
  const size_t body = f.size() - kTrailerBytes;
  bytes::store<uint64_t>(f.data() + body, frame_checksum({f.data(), body}));
}

std::vector<uint8_t> encode(Codec c, uint32_t block, std::optional<double> topk, int zstd,
                            const std::vector<float>& x) {
  PipelineConfig cfg;
  cfg.codec = c;
  cfg.block = block;
  cfg.topk = topk;
  cfg.zstd_level = zstd;
  Pipeline p(cfg);
  std::vector<uint8_t> f;
  p.encode(x, nullptr, f);
  return f;
}

template <class T>
std::vector<uint8_t> patch(std::vector<uint8_t> f, size_t off, T v, bool seal) {
  bytes::store<T>(f.data() + off, v);
  if (seal) reseal(f);
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: compression_make_corpus <dir>\n";
    return 2;
  }
  const fs::path dir = argv[1];
  fs::create_directories(dir / "valid");
  fs::create_directories(dir / "malformed");
  const auto x = synthetic_pseudo_gradient(300, 42, 64);
  const auto flat = std::vector<float>(512, 0.25f);
  for (Codec c : {Codec::kFp32, Codec::kFp16, Codec::kBf16, Codec::kInt8, Codec::kInt4, Codec::kFp4, Codec::kInt2}) {
    write(dir / "valid" / fmt::format("{}-dense.bin", codec_name(c)), encode(c, 64, std::nullopt, 0, x));
    write(dir / "valid" / fmt::format("{}-topk-packed.bin", codec_name(c)), encode(c, 128, 0.05, 0, x));
    write(dir / "valid" / fmt::format("{}-topk-bitmap.bin", codec_name(c)), encode(c, 16, 0.5, 0, x));
    write(dir / "valid" / fmt::format("{}-zstd.bin", codec_name(c)), encode(c, 32, std::nullopt, 3, flat));
  }
  write(dir / "valid" / "empty.bin", encode(Codec::kInt8, 64, std::nullopt, 0, {}));

  const size_t P = kHeaderBytes;
  const auto i8 = encode(Codec::kInt8, 64, std::nullopt, 0, x);  // 5 blocks: scales at P..P+20
  const auto i4 = encode(Codec::kInt4, 64, std::nullopt, 0, std::vector<float>(301, 0.5f));
  const auto tk = encode(Codec::kFp32, 128, 0.05, 0, x);  // k = 7: packed 7-bit indices, 7 bytes/block
  const auto bm = encode(Codec::kFp32, 16, 0.5, 0, x);    // bitmaps, 2 bytes/block
  const auto zs = encode(Codec::kFp32, 32, std::nullopt, 3, flat);
  auto m = [&](const char* name, const std::vector<uint8_t>& f) { write(dir / "malformed" / name, f); };
  m("truncated-empty.bin", {});
  m("truncated-half-header.bin", std::vector<uint8_t>(i8.begin(), i8.begin() + 20));
  m("truncated-payload.bin", std::vector<uint8_t>(i8.begin(), i8.end() - 9));
  m("magic-png.bin", patch<uint32_t>(i8, 0, 0x474e5089, false));
  m("version-3.bin", patch<uint16_t>(i8, 4, 3, false));
  m("codec-200.bin", patch<uint8_t>(i8, 6, 200, false));
  m("flags-high-bit.bin", patch<uint8_t>(i8, 7, 0x80, false));
  m("block-zero.bin", patch<uint32_t>(i8, 8, 0, false));
  m("block-not-multiple-of-8.bin", patch<uint32_t>(i8, 8, 100, false));
  m("topk-k-without-flag.bin", patch<uint32_t>(i8, 12, 5, false));
  m("topk-k-above-block.bin", patch<uint32_t>(tk, 12, 129, false));
  m("count-max.bin", patch<uint64_t>(i8, 16, ~uint64_t{0}, false));
  m("size-raw-bytes.bin", patch<uint64_t>(i8, 24, 12345, false));
  m("size-stored-huge.bin", patch<uint64_t>(patch<uint8_t>(i8, 7, kFlagZstd, false), 32, ~uint64_t{0} >> 1, false));
  {
    auto f = i8;
    f.push_back(0);
    m("size-trailing-byte.bin", f);
  }
  m("checksum-flipped.bin", patch<uint8_t>(i8, P + 30, static_cast<uint8_t>(i8[P + 30] ^ 4), false));
  m("payload-negative-scale.bin", patch<float>(i8, P + 8, -1.0f, true));
  m("payload-nan-scale.bin", patch<uint32_t>(i8, P + 8, 0x7fc00000u, true));
  m("payload-huge-scale.bin", patch<float>(i8, P + 8, 0x1p70f, true));
  m("payload-int8-minus-128.bin", patch<uint8_t>(i8, P + 20 + 7, 0x80, true));
  m("payload-int4-code-0.bin", patch<uint8_t>(i4, P + 24 + 1, 0x08, true));
  m("payload-int4-padding.bin", patch<uint8_t>(i4, i4.size() - kTrailerBytes - 1, 0xf8, true));
  m("payload-topk-index-out-of-order.bin", patch<uint8_t>(tk, P, 0x7f, true));
  m("payload-bitmap-popcount.bin", patch<uint16_t>(bm, P, 0xffff, true));
  m("zstd-not-a-frame.bin", patch<uint32_t>(zs, P, 0x12345678, true));
  {
    // A zstd frame whose declared content size is far above raw_bytes.
    auto f = zs;
    const uint64_t raw = bytes::load<uint64_t>(f.data() + 24);
    std::vector<float> big(raw, 0.0f);  // raw floats -> 4 * raw bytes of zeros
    Pipeline p([] {
      PipelineConfig c;
      c.block = 32;
      c.zstd_level = 3;
      return c;
    }());
    std::vector<uint8_t> g;
    p.encode(big, nullptr, g);
    const uint64_t stored = bytes::load<uint64_t>(g.data() + 32);
    if (stored < raw) {
      std::vector<uint8_t> h(f.begin(), f.begin() + P);
      h.insert(h.end(), g.begin() + P, g.begin() + P + static_cast<long>(stored));
      h.resize(h.size() + kTrailerBytes);
      bytes::store<uint64_t>(h.data() + 32, stored);
      reseal(h);
      m("zstd-content-size-too-large.bin", h);
    }
  }
  std::cout << "corpus written to " << dir << "\n";
  return 0;
}

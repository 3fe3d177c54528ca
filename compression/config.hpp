// PipelineConfig: the `outer.compression` mapping of a run config.
//
//   outer:
//     compression:
//       codec: int8          # fp32 | fp16 | bf16 | int8 | int4 | fp4 | int2   (default fp32)
//       block: 128           # elements per scale block and per top-k block, 16..65536, multiple of 8
//       topk: 0.1            # optional: keep ceil(topk * block) largest |values| per block, (0, 1]
//       error_feedback: true # keep what was dropped and add it to the next outer step
//                            # (default: true for a lossy pipeline, false for plain fp32)
//       error_feedback_decay: 1.0  # (0, 1]: the residual is scaled by it before it is added
//                            # (SparseLoCo's accumulator e = beta e + delta; 1 = classic EF)
//       zstd_level: 3        # 0 = off, 1..19; zstd is applied per frame only when it shrinks it
//       threads: 1           # encode/decode a frame on this many threads (1..64); the bytes
//                            # do not depend on it (compression/parallel.hpp)
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "compression/codec.hpp"
#include "core/config_node.hpp"

namespace geoloco::compression {

inline constexpr uint32_t kMinBlock = 16;
inline constexpr uint32_t kMaxBlock = 65536;
inline constexpr int kMaxZstdLevel = 19;
inline constexpr int kMaxCodecThreads = 64;

struct PipelineConfig {
  Codec codec = Codec::kFp32;
  uint32_t block = 128;
  std::optional<double> topk;  // fraction kept per block; absent = dense
  bool error_feedback = false;
  double error_feedback_decay = 1.0;  // (0, 1]: residual scale before it is added (1: classic EF)
  int zstd_level = 0;                 // 0 = off
  int threads = 1;                    // encode/decode threads per frame (the bytes do not depend on it)

  static PipelineConfig from_yaml(const config::Node& node);
  // Throws ConfigError naming the field for values from_yaml would reject (for configs built
  // in code, e.g. by tests and the bench).
  void validate() const;

  // Values kept per full block when topk is set: ceil(topk * block), at least 1.
  uint32_t topk_per_block() const;
  bool lossy() const { return codec_is_lossy(codec) || topk.has_value(); }
  // "int8/b128/top0.1/ef/zstd3": for logs and bench tables.
  std::string describe() const;
};

}  // namespace geoloco::compression

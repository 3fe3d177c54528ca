#include "compression/config.hpp"

#include <fmt/format.h>

#include <cmath>

namespace geoloco::compression {

PipelineConfig PipelineConfig::from_yaml(const config::Node& node) {
  PipelineConfig c;
  const std::string name = node.get_choice("codec", "fp32", {"fp32", "fp16", "bf16", "int8", "int4", "fp4", "int2"});
  c.codec = *codec_from_name(name);
  c.block = static_cast<uint32_t>(node.get_int("block", 128, kMinBlock, kMaxBlock));
  if (c.block % 8 != 0)
    // Whole-byte blocks keep every block's bitmap and packed codes byte aligned.
    node.fail_value("block", "a multiple of 8");
  if (node.has("topk")) {
    const double f = node.get_double("topk", 1.0, 0.0, 1.0);
    if (!(f > 0.0)) node.fail_value("topk", "a fraction in (0, 1]");
    c.topk = f;
  }
  c.error_feedback = node.get<bool>("error_feedback", c.lossy());
  if (node.has("error_feedback_decay")) {
    c.error_feedback_decay = node.get_double("error_feedback_decay", 1.0, 0.0, 1.0);
    if (!(c.error_feedback_decay > 0.0)) node.fail_value("error_feedback_decay", "a number in (0, 1]");
    if (!c.error_feedback) node.fail("error_feedback_decay", "applies only with error_feedback: true");
  }
  c.zstd_level = static_cast<int>(node.get_int("zstd_level", 0, 0, kMaxZstdLevel));
  c.threads = static_cast<int>(node.get_int("threads", c.threads, 1, kMaxCodecThreads));
  node.finish();
  return c;
}

void PipelineConfig::validate() const {
  if (static_cast<int>(codec) >= kCodecCount)
    throw ConfigError(fmt::format("compression.codec: unknown codec id {}", static_cast<int>(codec)));
  if (block < kMinBlock || block > kMaxBlock || block % 8 != 0)
    throw ConfigError(
        fmt::format("compression.block: got {}, expected a multiple of 8 in [{}, {}]", block, kMinBlock, kMaxBlock));
  if (topk && !(*topk > 0.0 && *topk <= 1.0))
    throw ConfigError(fmt::format("compression.topk: got {}, expected a fraction in (0, 1]", *topk));
  if (!(error_feedback_decay > 0.0 && error_feedback_decay <= 1.0))
    throw ConfigError(
        fmt::format("compression.error_feedback_decay: got {}, expected a number in (0, 1]", error_feedback_decay));
  if (zstd_level < 0 || zstd_level > kMaxZstdLevel)
    throw ConfigError(
        fmt::format("compression.zstd_level: got {}, expected an integer in [0, {}]", zstd_level, kMaxZstdLevel));
  if (threads < 1 || threads > kMaxCodecThreads)
    throw ConfigError(
        fmt::format("compression.threads: got {}, expected an integer in [1, {}]", threads, kMaxCodecThreads));
}

uint32_t PipelineConfig::topk_per_block() const {
  if (!topk) return block;
  const double k = std::ceil(*topk * static_cast<double>(block));
  if (k < 1.0) return 1;
  if (k > block) return block;
  return static_cast<uint32_t>(k);
}

std::string PipelineConfig::describe() const {
  std::string s = fmt::format("{}/b{}", codec_name(codec), block);
  if (topk) s += fmt::format("/top{}", *topk);
  if (error_feedback) s += error_feedback_decay < 1.0 ? fmt::format("/ef{}", error_feedback_decay) : "/ef";
  if (zstd_level > 0) s += fmt::format("/zstd{}", zstd_level);
  return s;
}

}  // namespace geoloco::compression

#include <gtest/gtest.h>

#include "compression/config.hpp"

using namespace geoloco;
using namespace geoloco::compression;

namespace {

PipelineConfig parse(const std::string& yaml) {
  auto doc = config::load_string(yaml, "c.yaml");
  return PipelineConfig::from_yaml(doc.node().child("outer").child("compression"));
}

std::string error_of(const std::string& yaml) {
  try {
    parse(yaml);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "<no error>";
}

}  // namespace

TEST(CompressionConfig, FullMapping) {
  auto c = parse("outer:\n  compression: {codec: int8, block: 256, topk: 0.1, error_feedback: true, zstd_level: 3}\n");
  EXPECT_EQ(c.codec, Codec::kInt8);
  EXPECT_EQ(c.block, 256u);
  ASSERT_TRUE(c.topk.has_value());
  EXPECT_DOUBLE_EQ(*c.topk, 0.1);
  EXPECT_EQ(c.topk_per_block(), 26u);  // ceil(25.6)
  EXPECT_TRUE(c.error_feedback);
  EXPECT_EQ(c.zstd_level, 3);
  EXPECT_EQ(c.describe(), "int8/b256/top0.1/ef/zstd3");
}

TEST(CompressionConfig, DefaultsAreExactFp32WithoutFeedback) {
  auto c = parse("outer:\n  compression: {}\n");
  // An absent section gives the same defaults.
  EXPECT_EQ(parse("outer: {}\n").describe(), c.describe());
  EXPECT_EQ(c.codec, Codec::kFp32);
  EXPECT_EQ(c.block, 128u);
  EXPECT_FALSE(c.topk.has_value());
  EXPECT_FALSE(c.error_feedback);
  EXPECT_EQ(c.zstd_level, 0);
  EXPECT_EQ(c.topk_per_block(), 128u);
}

TEST(CompressionConfig, FeedbackDefaultsOnForLossyPipelines) {
  EXPECT_TRUE(parse("outer: {compression: {codec: int4}}\n").error_feedback);
  EXPECT_TRUE(parse("outer: {compression: {codec: fp32, topk: 0.5}}\n").error_feedback);
  EXPECT_FALSE(parse("outer: {compression: {codec: int4, error_feedback: false}}\n").error_feedback);
}

TEST(CompressionConfig, TinyTopkKeepsAtLeastOne) {
  EXPECT_EQ(parse("outer: {compression: {topk: 0.0001, block: 16}}\n").topk_per_block(), 1u);
  EXPECT_EQ(parse("outer: {compression: {topk: 1, block: 16}}\n").topk_per_block(), 16u);
}

TEST(CompressionConfig, RejectsBadValuesWithLocation) {
  EXPECT_EQ(error_of("outer:\n  compression:\n    codec: int3\n"),
            "c.yaml:3:12: outer.compression.codec: got 'int3', expected one of fp32 | fp16 | bf16 | int8 | int4 | "
            "fp4 | int2");
  EXPECT_EQ(error_of("outer:\n  compression:\n    block: 100\n"),
            "c.yaml:3:12: outer.compression.block: got '100', expected a multiple of 8");
  EXPECT_EQ(error_of("outer:\n  compression:\n    block: 8\n"),
            "c.yaml:3:12: outer.compression.block: got '8', expected an integer in [16, 65536]");
  EXPECT_EQ(error_of("outer:\n  compression:\n    topk: 0\n"),
            "c.yaml:3:11: outer.compression.topk: got '0', expected a fraction in (0, 1]");
  EXPECT_NE(error_of("outer:\n  compression:\n    topk: 1.5\n").find("outer.compression.topk: got '1.5'"),
            std::string::npos);
  EXPECT_NE(error_of("outer:\n  compression:\n    zstd_level: 20\n").find("expected an integer in [0, 19]"),
            std::string::npos);
  EXPECT_NE(error_of("outer:\n  compression:\n    zstd: 3\n").find("outer.compression.zstd: unknown key"),
            std::string::npos);
}

TEST(CompressionConfig, ValidateRejectsCodeBuiltConfigs) {
  PipelineConfig c;
  c.block = 12;
  EXPECT_THROW(c.validate(), ConfigError);
  c.block = 128;
  c.topk = 0.0;
  EXPECT_THROW(c.validate(), ConfigError);
  c.topk = std::nullopt;
  c.zstd_level = 22;
  EXPECT_THROW(c.validate(), ConfigError);
  c.zstd_level = 1;
  EXPECT_NO_THROW(c.validate());
}

// NCCL backend: compiled whenever CUDA is found, runs where a GPU is.
#include <gtest/gtest.h>

#include "trainer/parallel/gpu.hpp"

namespace geoloco::parallel {
namespace {

TEST(Gpu, ProbeIsConsistent) {
  // Without a GPU the probe must say why; with one it must say nothing.
  if (gpu_available()) {
    EXPECT_GT(gpu_count(), 0);
    EXPECT_EQ(gpu_unavailable_reason(), "");
  } else {
    EXPECT_EQ(gpu_count(), 0);
    EXPECT_NE(gpu_unavailable_reason(), "");
  }
}

}  // namespace
}  // namespace geoloco::parallel

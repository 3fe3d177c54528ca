// NCCL backend: compiled whenever CUDA is found, runs where a GPU is. Without a GPU the
// tests that need one skip with the CUDA runtime's reason; the "no device" failure path is
// tested everywhere.
#include <gtest/gtest.h>

#include <cstring>

#include "tests/trainer/parallel/ring_reference.hpp"
#include "tests/trainer/parallel/test_util.hpp"
#include "trainer/parallel/errors.hpp"
#include "trainer/parallel/gpu.hpp"
#include "trainer/parallel/nccl_collective.hpp"

#ifdef GEOLOCO_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace geoloco::parallel {
namespace {

using namespace std::chrono_literals;

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

// The failure path that this machine can exercise: without a GPU, make_nccl fails at once
// with the runtime's reason (before any rendezvous wait); with one, asking for a device that
// does not exist fails with the device count.
TEST(Nccl, UnusableDeviceFailsAtOnceWithTheReason) {
  auto t0 = std::chrono::steady_clock::now();
  auto o = testing::options("paris", 0, 1, test::fresh_port(), 10s);
  o.cuda_device = 999;
  try {
    make_nccl(o);
    FAIL() << "make_nccl succeeded on CUDA device 999";
  } catch (const CollectiveError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("site paris rank 0"), std::string::npos) << m;
    if (gpu_available()) {
      EXPECT_NE(m.find("cuda device 999 requested but"), std::string::npos) << m;
    } else {
      EXPECT_NE(m.find(gpu_unavailable_reason()), std::string::npos) << m;
    }
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
}

#ifdef GEOLOCO_HAVE_CUDA

// cudaMalloc'd floats with host copies in and out.
class DeviceFloats {
 public:
  explicit DeviceFloats(const std::vector<float>& host) : n_(host.size()) {
    EXPECT_EQ(cudaMalloc(&p_, std::max<size_t>(1, n_) * sizeof(float)), cudaSuccess);
    if (n_ > 0) {
      EXPECT_EQ(cudaMemcpy(p_, host.data(), n_ * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
  ~DeviceFloats() { cudaFree(p_); }
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;
  std::span<float> span() { return {static_cast<float*>(p_), n_}; }
  std::vector<float> host() const {
    std::vector<float> h(n_);
    if (n_ > 0) {
      EXPECT_EQ(cudaMemcpy(h.data(), p_, n_ * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    }
    return h;
  }

 private:
  void* p_ = nullptr;
  size_t n_;
};

TEST(Nccl, SingleRankOnOneGpu) {
  if (!gpu_available()) GTEST_SKIP() << "no usable GPU: " << gpu_unavailable_reason();
  auto c = make_nccl(testing::options("gpu", 0, 1, test::fresh_port()));
  EXPECT_STREQ(c->backend(), "nccl");
  EXPECT_EQ(c->memory(), MemorySpace::kCuda);
  std::vector<float> h = testing::rank_data(0, 1001);
  DeviceFloats d(h);
  c->all_reduce_sum(d.span());
  EXPECT_EQ(d.host(), h);  // sum over one rank is the identity, bit for bit
  DeviceFloats out(std::vector<float>(1001, 0.0f));
  c->reduce_scatter_sum(d.span(), out.span());
  EXPECT_EQ(out.host(), h);
  DeviceFloats gathered(std::vector<float>(1001, -1.0f));
  c->all_gather(out.span(), gathered.span());
  EXPECT_EQ(gathered.host(), h);
  c->broadcast(d.span(), 0);
  EXPECT_EQ(d.host(), h);
  c->barrier();
  std::vector<std::byte> blob = {std::byte{1}, std::byte{2}, std::byte{3}};
  auto all = c->all_gather_bytes(blob);
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0], blob);
  EXPECT_EQ(c->stats().total_bytes_sent(), 0u);  // one rank sends nothing
  EXPECT_EQ(c->stats()[CollectiveKind::kAllGatherBytes].calls, 1u);
}

TEST(Nccl, MultiRankCollectivesMatchTheExactAnswers) {
  if (!gpu_available()) GTEST_SKIP() << "no usable GPU: " << gpu_unavailable_reason();
  if (gpu_count() < 2)
    GTEST_SKIP() << "needs 2 GPUs (NCCL refuses two ranks of one communicator on the same device); found "
                 << gpu_count();
  const int P = std::min(gpu_count(), 4);
  const int port = test::fresh_port();
  test::run_ranks(P, [&](int r) {
    auto o = testing::options("gpu", r, P, port, 60s);
    o.cuda_device = r;
    auto c = make_nccl(o);
    for (int64_t n : {int64_t{1}, int64_t{P + 1}, int64_t{1} << 20}) {
      DeviceFloats d(std::vector<float>(static_cast<size_t>(n), static_cast<float>(r)));
      c->all_reduce_sum(d.span());
      for (float x : d.host()) ASSERT_EQ(x, static_cast<float>(P * (P - 1) / 2));
      // Uneven reduce-scatter + all-gather: integers, so every order gives the exact sum.
      std::vector<float> in(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) in[static_cast<size_t>(i)] = static_cast<float>((i % 7) + r);
      DeviceFloats din(in);
      ShardRange s = shard_of(n, r, P);
      DeviceFloats shard(std::vector<float>(static_cast<size_t>(s.count), 0.0f));
      c->reduce_scatter_sum(din.span(), shard.span());
      DeviceFloats full(std::vector<float>(static_cast<size_t>(n), -1.0f));
      c->all_gather(shard.span(), full.span());
      auto h = full.host();
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(h[static_cast<size_t>(i)], static_cast<float>(P * (i % 7) + P * (P - 1) / 2)) << i;
      DeviceFloats b(std::vector<float>(static_cast<size_t>(n), r == P - 1 ? 5.0f : 0.0f));
      c->broadcast(b.span(), P - 1);
      for (float x : b.host()) ASSERT_EQ(x, 5.0f);
    }
    std::vector<std::byte> mine(static_cast<size_t>(r + 1), static_cast<std::byte>(r));
    auto all = c->all_gather_bytes(mine);
    for (int i = 0; i < P; ++i)
      EXPECT_EQ(all[static_cast<size_t>(i)],
                std::vector<std::byte>(static_cast<size_t>(i + 1), static_cast<std::byte>(i)));
  });
}

#endif  // GEOLOCO_HAVE_CUDA

}  // namespace
}  // namespace geoloco::parallel

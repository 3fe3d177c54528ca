// The device quantization kernels (trainer/cuda/quantize_kernel.hpp) against the CPU codec
// (compression/values.hpp): for every scaled codec, group sizes with and without a short last
// group, heavy-tailed data, all-zero and tiny (subnormal-scale) groups, ties and thresholds,
// the scales and packed codes must be the CPU encoder's bytes exactly, the error-feedback
// residual the CPU pipeline's (corrected - decoded) bit for bit, and the frame the host makes
// of the staged bytes (Pipeline::encode_staged) the CPU pipeline's frame. Runs on a GPU and on
// the CUDA emulator.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "compression/pipeline.hpp"
#include "compression/values.hpp"
#include "gpu_test_util.hpp"
#include "trainer/cuda/quantize_kernel.hpp"

namespace geoloco::cuda::testing {
namespace {

using compression::Codec;

struct Case {
  Codec cpu;
  QuantCodec dev;
};
constexpr Case kCases[] = {{Codec::kInt8, QuantCodec::kInt8},
                           {Codec::kInt4, QuantCodec::kInt4},
                           {Codec::kFp4, QuantCodec::kFp4},
                           {Codec::kInt2, QuantCodec::kInt2}};

template <class T>
DeviceBuffer<T> upload(const std::vector<T>& v) {
  DeviceBuffer<T> d(std::max<size_t>(v.size(), 1), "quantize test");
  if (!v.empty())
    check_cuda(cudaMemcpy(d.data(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), "quantize upload");
  return d;
}

template <class T>
std::vector<T> download(const DeviceBuffer<T>& d, size_t n) {
  check_cuda(cudaDeviceSynchronize(), "quantize synchronize");
  std::vector<T> v(n);
  if (n) check_cuda(cudaMemcpy(v.data(), d.data(), n * sizeof(T), cudaMemcpyDeviceToHost), "quantize download");
  return v;
}

// Heavy-tailed values (a normal times an occasional large factor), then special groups where
// there is room: all zero; subnormal magnitudes (the scale underflows, or 1/s overflows);
// int4 ties (absmax 7: y = x exactly, halves); int8 ties (absmax 127, halves); fp4's
// thresholds (absmax 1: y = |x|, at 2^-7 and at 1.5 x 2^k between levels), signs mixed.
std::vector<float> test_values(size_t n, size_t group, uint64_t seed) {
  std::vector<float> x = random_vec(n, seed, 0.01);
  Rng r(seed + 7);
  for (auto& v : x)
    if (r.uniform() < 0.02) v *= 40.0f;
  if (n < 5 * group) return x;
  auto sign = [](size_t i) { return i % 2 ? -1.0f : 1.0f; };
  for (size_t i = 0; i < group; ++i) x[i] = 0.0f;
  for (size_t i = group; i < 2 * group; ++i) x[i] = sign(i) * 1e-44f * float(i % 5);
  for (size_t i = 2 * group; i < 3 * group; ++i) x[i] = i == 2 * group ? 7.0f : sign(i) * 0.5f * float(i % 15);
  for (size_t i = 3 * group; i < 4 * group; ++i) x[i] = i == 3 * group ? 127.0f : sign(i) * (0.5f + float(i % 127));
  const float fp4[] = {1.0f, 0x1p-7f, 0x1p-8f, 0x1.8p-1f, 0x1.8p-3f, 0x1.8p-6f, 0x1.7fffffp-4f, 0x1.000002p-7f};
  for (size_t i = 4 * group; i < 5 * group; ++i) x[i] = i == 4 * group ? 1.0f : sign(i) * fp4[i % 8];
  return x;
}

void expect_same_as_cpu(const Case& c, size_t n, size_t group, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << compression::codec_name(c.cpu) << " n=" << n << " group=" << group);
  const std::vector<float> x = test_values(n, group, seed);
  const size_t groups = quant_groups(n, group), code_bytes = quant_code_bytes(n, c.dev);
  // CPU.
  std::vector<uint8_t> cpu_scales(groups * 4), cpu_codes(code_bytes), scratch;
  compression::encode_values(c.cpu, x, group, cpu_scales.data(), cpu_codes.data(), scratch);
  std::vector<float> decoded(n);
  compression::decode_values(c.cpu, cpu_scales.data(), cpu_codes.data(), n, group, decoded.data(), scratch);
  // Device.
  auto dx = upload(x);
  DeviceBuffer<float> dscales(std::max<size_t>(groups, 1)), dinv(std::max<size_t>(groups, 1)),
      dres(std::max<size_t>(n, 1));
  DeviceBuffer<uint8_t> dcodes(std::max<size_t>(code_bytes, 1)), dq(std::max<size_t>(n, 1));
  launch_quantize(c.dev, dx.data(), n, group, dscales.data(), dcodes.data(), dinv.data(), dq.data(), nullptr);
  launch_ef_residual(c.dev, dx.data(), dscales.data(), dq.data(), n, group, dres.data(), nullptr);
  const auto scales = download(dscales, groups);
  const auto codes = download(dcodes, code_bytes);
  const auto res = download(dres, n);
  ASSERT_EQ(std::memcmp(scales.data(), cpu_scales.data(), groups * 4), 0) << "scales differ";
  size_t first = code_bytes;
  for (size_t i = 0; i < code_bytes && first == code_bytes; ++i)
    if (codes[i] != cpu_codes[i]) first = i;
  ASSERT_EQ(first, code_bytes) << "codes differ from byte " << first << ": device " << int(codes[first]) << ", cpu "
                               << int(cpu_codes[first]);
  for (size_t i = 0; i < n; ++i) {
    const float want = x[i] - decoded[i];
    ASSERT_EQ(std::memcmp(&res[i], &want, 4), 0) << "residual at " << i << ": " << res[i] << " vs " << want;
  }
  // The staged bytes framed on the host are the frame the CPU pipeline makes of x (zstd on).
  compression::PipelineConfig pc;
  pc.codec = c.cpu;
  pc.block = static_cast<uint32_t>(group);
  pc.zstd_level = 1;
  compression::Pipeline cpu(pc), host(pc);
  std::vector<uint8_t> want_frame, got_frame;
  cpu.encode(x, nullptr, want_frame);
  std::vector<uint8_t> scale_bytes(groups * 4);
  std::memcpy(scale_bytes.data(), scales.data(), scale_bytes.size());
  host.encode_staged(scale_bytes, codes, n, got_frame);
  EXPECT_EQ(got_frame, want_frame);
}

TEST(QuantizeKernel, ScalesCodesAndResidualAreTheCpuCodecsBits) {
  GEOLOCO_REQUIRE_GPU();
  for (const Case& c : kCases)
    for (const auto& [n, group] : std::vector<std::pair<size_t, size_t>>{{4096, 128}, {1000, 128}, {777, 64}, {5, 16}})
      expect_same_as_cpu(c, n, group, 11 + n);
}

// Error feedback's first step: corrected = values + residual, or values + beta * residual.
TEST(QuantizeKernel, ErrorFeedbackCorrectionIsThePipelines) {
  GEOLOCO_REQUIRE_GPU();
  const size_t n = 3001;
  const auto v = random_vec(n, 5, 0.1), r = random_vec(n, 6, 0.01);
  auto dv = upload(v), dr = upload(r);
  DeviceBuffer<float> out(n);
  for (const float beta : {1.0f, 0.9f}) {
    launch_ef_correct(dv.data(), dr.data(), beta, out.data(), n, nullptr);
    const auto got = download(out, n);
    for (size_t i = 0; i < n; ++i) {
      const float want = beta < 1.0f ? v[i] + beta * r[i] : v[i] + r[i];
      ASSERT_EQ(std::memcmp(&got[i], &want, 4), 0) << "beta " << beta << " at " << i;
    }
  }
}

// The outer loop's elementwise steps on the device (trainer/loop/cuda_outer_stage.cpp): the
// pseudo-gradient global - local and the merge alpha * local + (1 - alpha) * global (or the
// copy), bit for bit the host's contraction-free loops.
TEST(QuantizeKernel, PseudoGradientAndMergeAreTheHostsBits) {
  GEOLOCO_REQUIRE_GPU();
  const size_t n = 2053;
  const auto g = random_vec(n, 21, 0.3), x = random_vec(n, 22, 0.3);
  auto dg = upload(g), dx = upload(x);
  DeviceBuffer<float> out(n);
  launch_pseudo_gradient(dg.data(), dx.data(), out.data(), n, nullptr);
  const auto delta = download(out, n);
  for (size_t i = 0; i < n; ++i) {
    const float want = g[i] - x[i];
    ASSERT_EQ(std::memcmp(&delta[i], &want, 4), 0) << "pseudo-gradient at " << i;
  }
  for (const float alpha : {0.5f, 0.3f, 0.0f}) {
    auto dl = upload(x);
    launch_merge(dl.data(), dg.data(), alpha, /*copy=*/false, n, nullptr);
    const auto got = download(dl, n);
    const float a = alpha, b = 1.0f - a;
    for (size_t i = 0; i < n; ++i) {
      volatile float ax = a * x[i], bg = b * g[i];  // rounded apart, as the host's loop is
      const float want = ax + bg;
      ASSERT_EQ(std::memcmp(&got[i], &want, 4), 0) << "merge alpha " << alpha << " at " << i;
    }
  }
  auto dl = upload(x);
  launch_merge(dl.data(), dg.data(), 0.5f, /*copy=*/true, n, nullptr);
  const auto copied = download(dl, n);
  EXPECT_EQ(std::memcmp(copied.data(), g.data(), n * 4), 0);
}

// The round's error figures: sum (decoded - delta)^2 and sum delta^2 over a quantized run
// (the host's add_own_error up to summation order), and the count of corrected values the CPU
// encoder refuses (non-finite, |x| > 2^64), whatever the codec.
TEST(QuantizeKernel, ErrorPartialsSumTheErrorAndCountRefusedValues) {
  GEOLOCO_REQUIRE_GPU();
  for (const auto& c : kCases) {
    const size_t n = 5000, group = 64;
    const auto x = test_values(n, group, 31);
    auto dx = upload(x);
    const size_t groups = quant_groups(n, group);
    DeviceBuffer<float> scales(groups), inv(groups);
    DeviceBuffer<uint8_t> codes(quant_code_bytes(n, c.dev)), q(n);
    DeviceBuffer<double> partial(3 * kErrorBlocks);
    launch_quantize(c.dev, dx.data(), n, group, scales.data(), codes.data(), inv.data(), q.data(), nullptr);
    launch_error_partials(c.dev, dx.data(), dx.data(), scales.data(), q.data(), n, group, partial.data(), nullptr);
    const auto sums = sum_error_partials(download(partial, 3 * kErrorBlocks).data());
    // The host: decode the CPU encoder's bytes of the same values.
    compression::PipelineConfig pc;
    pc.codec = c.cpu;
    pc.block = group;
    compression::Pipeline p(pc);
    std::vector<uint8_t> frame;
    p.encode(x, nullptr, frame);
    std::vector<float> dec(n);
    p.decode(frame, n, dec);
    double err2 = 0, ref2 = 0;
    for (size_t i = 0; i < n; ++i) {
      const double e = double(dec[i]) - double(x[i]);
      err2 += e * e;
      ref2 += double(x[i]) * double(x[i]);
    }
    EXPECT_GT(err2, 0) << compression::codec_name(c.cpu);
    EXPECT_NEAR(sums.err2, err2, 1e-12 * ref2 + 1e-9 * err2) << compression::codec_name(c.cpu);
    EXPECT_NEAR(sums.ref2, ref2, 1e-9 * ref2) << compression::codec_name(c.cpu);
    EXPECT_EQ(sums.refused, 0) << compression::codec_name(c.cpu);
    // Refused corrected values are counted (the error sums read `delta`, kept finite).
    auto bad = x;
    bad[7] = NAN;
    bad[100] = INFINITY;
    bad[4999] = -0x1p65f;
    bad[4998] = 0x1p64f;  // at the bound: accepted
    auto dbad = upload(bad);
    launch_error_partials(c.dev, dx.data(), dbad.data(), scales.data(), q.data(), n, group, partial.data(), nullptr);
    EXPECT_EQ(sum_error_partials(download(partial, 3 * kErrorBlocks).data()).refused, 3)
        << compression::codec_name(c.cpu);
  }
}

}  // namespace
}  // namespace geoloco::cuda::testing

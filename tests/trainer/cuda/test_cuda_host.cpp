// Host-side logic of the GPU path, tested without a GPU: bf16 rounding, precision parsing,
// CUDA error classification and messages, device selection, architecture compatibility,
// parity metrics and tolerances, and the GPU check report (library and tool).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <thread>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/support/temp_dir.hpp"
#include "trainer/cuda/bf16.hpp"
#include "trainer/cuda/check_report.hpp"
#include "trainer/cuda/cuda_error.hpp"
#include "trainer/cuda/device_select.hpp"
#include "trainer/cuda/op_times.hpp"
#include "trainer/cuda/ordered_worker.hpp"
#include "trainer/cuda/attention_choice.hpp"
#include "trainer/cuda/precision.hpp"
#include "trainer/cuda/token_buckets.hpp"
#include "trainer/cuda/tolerance.hpp"
#include "core/rng.hpp"

namespace geoloco::cuda {
namespace {

// ---- bf16 ---------------------------------------------------------------------------

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16_bits(1.0f), 0x3F80);
  // 1 + 2^-8 lies exactly between 1 (0x3F80, even) and 1 + 2^-7 (0x3F81): ties to even.
  EXPECT_EQ(float_to_bf16_bits(1.0f + std::ldexp(1.0f, -8)), 0x3F80);
  // 1 + 3*2^-8 lies between 0x3F81 (odd) and 0x3F82 (even): up to even.
  EXPECT_EQ(float_to_bf16_bits(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);
  // Just above the half-way point rounds up.
  EXPECT_EQ(float_to_bf16_bits(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3F81);
  // Just below it rounds down.
  EXPECT_EQ(float_to_bf16_bits(1.0f + std::ldexp(1.0f, -8) - std::ldexp(1.0f, -20)), 0x3F80);
  EXPECT_EQ(float_to_bf16_bits(-2.0f), 0xC000);
  EXPECT_EQ(float_to_bf16_bits(-0.0f), 0x8000);
}

TEST(Bf16, SpecialValues) {
  EXPECT_EQ(float_to_bf16_bits(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(float_to_bf16_bits(-std::numeric_limits<float>::infinity()), 0xFF80);
  // The largest float is above bf16's largest finite value by more than half an ulp: inf.
  EXPECT_EQ(float_to_bf16_bits(std::numeric_limits<float>::max()), 0x7F80);
  const uint16_t nan = float_to_bf16_bits(std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(std::isnan(bf16_bits_to_float(nan)));
  // A signalling NaN whose payload sits only in the dropped bits must not become infinity.
  const float snan = std::bit_cast<float>(0x7F800001u);
  EXPECT_TRUE(std::isnan(bf16_bits_to_float(float_to_bf16_bits(snan))));
  // The smallest subnormal rounds to zero (it is far below half of bf16's smallest subnormal
  // ulp, which equals float's 2^-133).
  EXPECT_EQ(float_to_bf16_bits(std::numeric_limits<float>::denorm_min()), 0x0000);
}

TEST(Bf16, EveryBf16ValueRoundTrips) {
  int checked = 0;
  for (uint32_t b = 0; b <= 0xFFFF; ++b) {
    const float f = bf16_bits_to_float(static_cast<uint16_t>(b));
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_bf16_bits(f), b) << "bits " << b;
    ++checked;
  }
  EXPECT_EQ(checked, 65536 - 2 * 127);  // 2 * (2^7 - 1) NaN patterns
}

TEST(Bf16, SpanHelpers) {
  std::vector<float> in{1.0f, 3.140625f, -1e-3f}, back(3);
  std::vector<uint16_t> bits(3);
  floats_to_bf16(in, bits);
  bf16_to_floats(bits, back);
  EXPECT_EQ(back[0], 1.0f);
  EXPECT_EQ(back[1], 3.140625f);  // exactly representable: 8 significant bits
  EXPECT_EQ(back[2], round_to_bf16(-1e-3f));
  EXPECT_NE(back[2], -1e-3f);
}

// ---- precision ----------------------------------------------------------------------

TEST(Precision, ParsesTheTwoChoices) {
  EXPECT_EQ(parse_precision("fp32"), Precision::Fp32);
  EXPECT_EQ(parse_precision("bf16"), Precision::Bf16);
  EXPECT_STREQ(precision_name(Precision::Bf16), "bf16");
  EXPECT_EQ(activation_bytes(Precision::Fp32), 4);
  EXPECT_EQ(activation_bytes(Precision::Bf16), 2);
}

TEST(AttentionChoice, FusedOnlyForBf16AndHeadSizesItServes) {
  EXPECT_EQ(parse_attention_kernel("auto"), AttentionKernel::Auto);
  EXPECT_EQ(parse_attention_kernel("fused"), AttentionKernel::Fused);
  EXPECT_EQ(parse_attention_kernel("materialized"), AttentionKernel::Materialized);
  EXPECT_THROW(parse_attention_kernel("flash"), ConfigError);
  EXPECT_STREQ(attention_kernel_name(AttentionKernel::Materialized), "materialized");
  EXPECT_TRUE(fused_attention_fits(768, 12));   // GPT-2 124M: 64
  EXPECT_TRUE(fused_attention_fits(64, 4));     // 16
  EXPECT_FALSE(fused_attention_fits(96, 4));    // 24
  EXPECT_FALSE(fused_attention_fits(1024, 8));  // 128
  EXPECT_FALSE(fused_attention_fits(64, 0));
  EXPECT_TRUE(uses_fused_attention(AttentionKernel::Auto, Precision::Bf16, 768, 12));
  EXPECT_FALSE(uses_fused_attention(AttentionKernel::Auto, Precision::Fp32, 768, 12));
  EXPECT_FALSE(uses_fused_attention(AttentionKernel::Auto, Precision::Bf16, 96, 4));
  EXPECT_FALSE(uses_fused_attention(AttentionKernel::Materialized, Precision::Bf16, 768, 12));
  EXPECT_TRUE(uses_fused_attention(AttentionKernel::Fused, Precision::Bf16, 768, 12));
  EXPECT_THROW(uses_fused_attention(AttentionKernel::Fused, Precision::Fp32, 768, 12), ConfigError);
  // Auto weighs the materialized attention's memory: GPT-2 124M, B 32, T 1024, bf16 holds
  // 12 layers x 32 x 12 x 1024^2 x 2 bytes of probabilities + the workspace's 6 bytes a score.
  const int64_t m = materialized_attention_bytes(12, 12, 32, 1024, 2);
  EXPECT_EQ(m, int64_t(32) * 12 * 1024 * 1024 * (12 * 2 + 6));
  constexpr int64_t kGiB = int64_t(1) << 30;
  EXPECT_FALSE(uses_fused_attention(AttentionKernel::Auto, Precision::Bf16, 768, 12, m, 130 * kGiB));  // H200: fits
  EXPECT_TRUE(uses_fused_attention(AttentionKernel::Auto, Precision::Bf16, 768, 12, m, 20 * kGiB));    // > half
  EXPECT_TRUE(uses_fused_attention(AttentionKernel::Auto, Precision::Bf16, 768, 12, 0, 130 * kGiB));   // B unknown
  EXPECT_TRUE(uses_fused_attention(AttentionKernel::Fused, Precision::Bf16, 768, 12, m, 130 * kGiB));  // as asked
  EXPECT_FALSE(uses_fused_attention(AttentionKernel::Auto, Precision::Fp32, 768, 12, m, 40 * kGiB));   // fp32: no fused
  EXPECT_NE(fused_attention_refusal(Precision::Bf16, 96, 4).find("n_embd / n_head = 96 / 4"), std::string::npos);
}

TEST(Precision, RejectsOthersNamingTheValue) {
  try {
    parse_precision("fp16");
    FAIL() << "fp16 accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("'fp16'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("fp32 or bf16"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_precision(""), ConfigError);
  EXPECT_THROW(parse_precision("BF16"), ConfigError);
}

// ---- errors -------------------------------------------------------------------------

TEST(CudaErrors, ClassifiesRuntimeCodes) {
  EXPECT_EQ(classify_cuda_status(codes::kMemoryAllocation), CudaErrorKind::OutOfMemory);
  for (int c : {codes::kStubLibrary, codes::kInsufficientDriver, codes::kCallRequiresNewerDriver,
                codes::kDevicesUnavailable, codes::kNoDevice, codes::kInvalidDevice})
    EXPECT_EQ(classify_cuda_status(c), CudaErrorKind::NoDevice) << c;
  EXPECT_EQ(classify_cuda_status(codes::kNoKernelImageForDevice), CudaErrorKind::ArchMismatch);
  EXPECT_EQ(classify_cuda_status(codes::kUnsupportedPtxVersion), CudaErrorKind::ArchMismatch);
  EXPECT_EQ(classify_cuda_status(700), CudaErrorKind::Other);  // illegal address
  EXPECT_EQ(classify_cuda_status(1), CudaErrorKind::Other);    // invalid value
  EXPECT_EQ(classify_cublas_status(codes::kCublasAllocFailed), CudaErrorKind::OutOfMemory);
  EXPECT_EQ(classify_cublas_status(codes::kCublasArchMismatch), CudaErrorKind::ArchMismatch);
  EXPECT_EQ(classify_cublas_status(7), CudaErrorKind::Other);  // invalid value
}

TEST(CudaErrors, ThrowsTheTypedClassWithContext) {
  try {
    throw_cuda_error(CudaErrorKind::OutOfMemory, "CUDA", "cudaMalloc activations (B 16 T 1024)", 3, 2,
                     "cudaErrorMemoryAllocation", "out of memory");
    FAIL();
  } catch (const CudaOutOfMemory& e) {
    const std::string m = e.what();
    EXPECT_EQ(e.device(), 3);
    EXPECT_EQ(e.code(), 2);
    EXPECT_EQ(e.op(), "cudaMalloc activations (B 16 T 1024)");
    EXPECT_EQ(m,
              "CUDA error in cudaMalloc activations (B 16 T 1024) on device 3: cudaErrorMemoryAllocation (2): out of "
              "memory [out of device memory]; lower train.micro_batch (or sequence length) or use bf16");
  }
  EXPECT_THROW(throw_cuda_error(CudaErrorKind::NoDevice, "CUDA", "x", -1, 100, "n", "t"), CudaNoDevice);
  EXPECT_THROW(throw_cuda_error(CudaErrorKind::ArchMismatch, "cuBLAS", "x", 0, 8, "n", "t"), CudaArchMismatch);
  try {
    throw_cuda_error(CudaErrorKind::Other, "cuBLAS", "gemm", -1, 7, "CUBLAS_STATUS_INVALID_VALUE", "bad ld");
    FAIL();
  } catch (const CudaOutOfMemory&) {
    FAIL() << "wrong class";
  } catch (const CudaError& e) {
    EXPECT_EQ(e.kind(), CudaErrorKind::Other);
    EXPECT_NE(std::string(e.what()).find("device (none selected)"), std::string::npos) << e.what();
  }
  // Every class is a geoloco::Error (the CLI maps it to exit 1).
  EXPECT_THROW(throw_cuda_error(CudaErrorKind::Other, "CUDA", "x", 0, 1, "n", "t"), geoloco::Error);
}

// ---- device selection ---------------------------------------------------------------

TEST(DeviceSelect, LocalRankTakesItsGpu) {
  for (int r = 0; r < 8; ++r) EXPECT_EQ(device_for_local_rank(r, 8, 8), r);
  EXPECT_EQ(device_for_local_rank(1, 2, 8), 1);     // fewer ranks than GPUs is fine
  EXPECT_EQ(device_for_local_rank(0, 4, 8, 5), 5);  // pinned
}

TEST(DeviceSelect, FailuresSayWhy) {
  EXPECT_THROW(device_for_local_rank(0, 1, 0), CudaNoDevice);
  try {
    device_for_local_rank(2, 4, 2);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("4 ranks on this node but only 2 visible GPU(s)"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(device_for_local_rank(0, 1, 2, 2), ConfigError);
  EXPECT_THROW(device_for_local_rank(4, 4, 8), geoloco::Error);
  EXPECT_THROW(device_for_local_rank(-1, 4, 8), geoloco::Error);
}

TEST(ArchCompat, SassAndPtxRules) {
  EXPECT_TRUE(arch_compatible(9, 0, "90"));
  EXPECT_TRUE(arch_compatible(10, 0, "90"));        // PTX JIT
  EXPECT_FALSE(arch_compatible(10, 0, "90-real"));  // SASS only
  EXPECT_TRUE(arch_compatible(9, 0, "90-real"));
  EXPECT_FALSE(arch_compatible(8, 0, "90"));  // older GPU than the build
  EXPECT_TRUE(arch_compatible(8, 6, "80-real"));
  EXPECT_FALSE(arch_compatible(8, 0, "86-real"));
  EXPECT_TRUE(arch_compatible(8, 9, "80-real;90"));
  EXPECT_TRUE(arch_compatible(12, 0, "90-virtual"));
  EXPECT_FALSE(arch_compatible(8, 0, "90-virtual"));
  EXPECT_TRUE(arch_compatible(9, 0, "90a"));
  EXPECT_FALSE(arch_compatible(10, 0, "90a"));
  EXPECT_THROW(arch_compatible(9, 0, "sm90"), geoloco::Error);
  EXPECT_THROW(arch_compatible(9, 0, "90-fake"), geoloco::Error);
  EXPECT_FALSE(arch_compatible(9, 0, ""));
}

// ---- parity metric and tolerances ---------------------------------------------------

TEST(Compare, RelativeL2AndMaxAbs) {
  const std::vector<float> got{1, 2, 2}, want{1, 2, 3};
  const ErrorStats s = compare(got, want);
  EXPECT_DOUBLE_EQ(s.rel_l2, std::sqrt(1.0 / 14.0));
  EXPECT_DOUBLE_EQ(s.max_abs, 1.0);
  EXPECT_EQ(s.count, 3);
  EXPECT_TRUE(s.finite);
  EXPECT_TRUE(within(s, 0.3));
  EXPECT_FALSE(within(s, 0.2));
}

TEST(Compare, ZerosNanAndSizes) {
  const std::vector<float> z{0, 0}, one{0, 1e-30f};
  EXPECT_EQ(compare(z, z).rel_l2, 0.0);
  EXPECT_TRUE(within(compare(z, z), 0.0));
  EXPECT_TRUE(std::isinf(compare(one, z).rel_l2));
  const std::vector<float> nan{std::nanf(""), 1};
  const ErrorStats s = compare(nan, std::vector<float>{1, 1});
  EXPECT_FALSE(s.finite);
  EXPECT_FALSE(within(s, 1e9));
  EXPECT_THROW(compare(z, std::vector<float>{0}), geoloco::Error);
}

TEST(Tolerance, TableCoversEveryOpAndBf16IsLooser) {
  const char* ops[] = {"encoder_forward",
                       "encoder_backward",
                       "layernorm_forward",
                       "layernorm_backward",
                       "matmul_forward",
                       "matmul_backward",
                       "attention_forward",
                       "attention_backward",
                       "gelu_forward",
                       "gelu_backward",
                       "residual_forward",
                       "residual_backward",
                       "lm_head_forward",
                       "lm_head_backward",
                       "crossentropy_forward",
                       "crossentropy_backward",
                       "adamw",
                       "muon",
                       "cast_bf16",
                       "grad_norm",
                       "model.loss",
                       "model.grads",
                       "model.probs",
                       "train.loss",
                       "staging"};
  for (const char* op : ops) {
    EXPECT_GE(tolerance(op, Precision::Bf16), tolerance(op, Precision::Fp32)) << op;
    EXPECT_LT(tolerance(op, Precision::Bf16), 0.1) << op;  // a loose table would hide bugs
  }
  EXPECT_EQ(tolerance_table().size(), std::size(ops));
  EXPECT_THROW(tolerance("matmul_fwd", Precision::Fp32), geoloco::Error);
}

// ---- check report -------------------------------------------------------------------

TEST(CheckReport, ParsesSteps) {
  const CheckStep s = parse_check_step("build:0:212.5");
  EXPECT_EQ(s.name, "build");
  EXPECT_EQ(s.rc, 0);
  EXPECT_DOUBLE_EQ(s.seconds, 212.5);
  EXPECT_EQ(parse_check_step("tests:137:3").rc, 137);
  for (const char* bad : {"build:0", "build", ":0:1", "b:x:1", "b:0:", "b:0:-1", "b:0:1s", "b::1"})
    EXPECT_THROW(parse_check_step(bad), InputError) << bad;
}

TEST(CheckReport, OkOnlyWhenEverythingPassed) {
  const std::vector<CheckStep> good{{"build", 0, 100}, {"tests", 0, 50.5}};
  const std::string parity = R"({"ok": true, "ops": []})", bench = R"({"tokens_per_s": 1000})";
  nlohmann::json r = assemble_check_report(good, "NVIDIA H200", parity, bench);
  EXPECT_EQ(r["magic"], "geoloco-gpu-check");
  EXPECT_EQ(r["version"], 1);
  EXPECT_TRUE(r["ok"].get<bool>());
  EXPECT_DOUBLE_EQ(r["total_seconds"].get<double>(), 150.5);
  EXPECT_EQ(r["bench"]["tokens_per_s"], 1000);
  EXPECT_TRUE(r["problems"].empty());

  r = assemble_check_report({{"build", 0, 1}, {"tests", 8, 2}}, "g", parity, bench);
  EXPECT_FALSE(r["ok"].get<bool>());
  EXPECT_EQ(r["problems"][0], "step tests exited 8");

  r = assemble_check_report(good, "g", R"({"ok": false})", bench);
  EXPECT_FALSE(r["ok"].get<bool>());
  r = assemble_check_report(good, "g", "", bench);
  EXPECT_FALSE(r["ok"].get<bool>());
  EXPECT_TRUE(r["parity"].is_null());
  r = assemble_check_report(good, "g", parity, "{truncated");
  EXPECT_FALSE(r["ok"].get<bool>());
  EXPECT_EQ(r["problems"][0], "bench document is not a JSON object");
  EXPECT_FALSE(assemble_check_report({}, "g", parity, bench)["ok"].get<bool>());
}

// What a person (or the tail of a remote run's output) sees: the verdict, the figures and
// the costliest ops, in order; absent parts are skipped.
TEST(CheckReport, SummaryNamesTheFiguresAndTheCostliestOps) {
  const std::string bench = R"({"tokens_per_s": 412345.6, "batch": 32, "precision": "bf16", "attention": "fused",
    "step_ms": 79.47, "achieved_tflops": 353.21, "mfu": 0.357, "ratio": 0.8906,
    "peer": {"tokens_per_s": 463000},
    "op_profile": {"total_ms": 80.0, "ops": [
      {"op": "matmul.fc.bwd", "ms": 10.25, "calls": 12, "share": 0.128125},
      {"op": "attention.bwd", "ms": 9.5, "calls": 12, "share": 0.11875},
      {"op": "adamw", "ms": 1.0, "calls": 1, "share": 0.0125}]}})";
  const auto r =
      assemble_check_report({{"build", 0, 200.04}, {"bench", 0, 31.5}}, "NVIDIA H200", R"({"ok": true})", bench);
  const std::string s = summarize_check_report(r, 2);
  EXPECT_EQ(s,
            "gpu check: ok\n"
            "  gpu: NVIDIA H200\n"
            "  steps: build rc 0 (200.0 s), bench rc 0 (31.5 s)\n"
            "  bench: 412.3k tokens/s (B 32, bf16, fused attention), step 79.47 ms, 353.2 TFLOP/s, MFU 0.357, "
            "0.891x the peer (463k tokens/s)\n"
            "  ops of one profiled step (80.00 ms of device time):\n"
            "    matmul.fc.bwd           10.250 ms   12.8%  x12\n"
            "    attention.bwd            9.500 ms   11.9%  x12\n"
            "    ... 1 more\n");
  const auto bad = assemble_check_report({{"build", 2, 10}}, "g", "", "");
  EXPECT_EQ(summarize_check_report(bad),
            "gpu check: FAILED\n  gpu: g\n  steps: build rc 2 (10.0 s)\n  bench: none\n"
            "  problem: step build exited 2\n  problem: parity document missing\n  problem: bench document missing\n");
}

TEST(CheckReport, ToolWritesTheReportAndExitCode) {
  const geoloco::test::TempDir tmp("geoloco-gpu-report");
  const std::filesystem::path& dir = tmp.path();
  std::ofstream(dir / "parity.json") << R"({"ok": true})";
  std::ofstream(dir / "bench.json") << R"({"tokens_per_s": 5})";
  // Beside this test in the build tree (build/tests/cuda -> build/trainer/cuda): found from the test's own
  // path, so a build copied elsewhere (tools/gpu_bundle.sh) runs it too.
  const std::string tool =
      (std::filesystem::canonical("/proc/self/exe").parent_path() / "../../../trainer/cuda/geoloco_gpu_report")
          .string();
  const std::string base = tool + " --out " + (dir / "report.json").string() + " --gpu test --parity " +
                           (dir / "parity.json").string() + " --bench " + (dir / "bench.json").string();
  int rc = std::system((base + " --step build:0:1 --step tests:0:2 > /dev/null").c_str());
  EXPECT_EQ(WEXITSTATUS(rc), 0);
  nlohmann::json r = nlohmann::json::parse(std::ifstream(dir / "report.json"));
  EXPECT_TRUE(r["ok"].get<bool>());
  EXPECT_EQ(r["steps"].size(), 2u);
  rc = std::system((base + " --step build:0:1 --step tests:1:2 > /dev/null").c_str());
  EXPECT_EQ(WEXITSTATUS(rc), 1);
  EXPECT_FALSE(nlohmann::json::parse(std::ifstream(dir / "report.json"))["ok"].get<bool>());
  rc = std::system((base + " --step nonsense > /dev/null 2>&1").c_str());
  EXPECT_EQ(WEXITSTATUS(rc), 2);
}

// ---- ordered worker ---------------------------------------------------------------

TEST(OrderedWorker, RunsTasksInPostingOrderOffTheCallingThread) {
  OrderedWorker w;
  std::vector<int> seen;
  std::thread::id worker_id;
  for (int i = 0; i < 100; ++i)
    w.post([&, i] {
      if (i == 0) worker_id = std::this_thread::get_id();
      seen.push_back(i);  // only the worker thread touches it before wait()
    });
  w.wait();
  ASSERT_EQ(seen.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(seen[size_t(i)], i);
  EXPECT_NE(worker_id, std::this_thread::get_id());
  w.wait();  // nothing pending: returns at once
}

TEST(OrderedWorker, FirstFailureSkipsTheRestAndIsRethrownOnce) {
  OrderedWorker w;
  int ran = 0;
  w.post([&] { ++ran; });
  w.post([] { throw InputError("collective 2 failed"); });
  w.post([&] { ++ran; });  // must be skipped
  try {
    w.wait();
    FAIL() << "no exception";
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(), "collective 2 failed");
  }
  EXPECT_EQ(ran, 1);
  // Cleared: the next step's tasks run again.
  w.post([&] { ++ran; });
  EXPECT_NO_THROW(w.wait());
  EXPECT_EQ(ran, 2);
}

TEST(OrderedWorker, DestructorFinishesQueuedTasks) {
  std::atomic<int> ran{0};
  {
    OrderedWorker w;
    for (int i = 0; i < 10; ++i)
      w.post([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        ++ran;
      });
  }
  EXPECT_EQ(ran.load(), 10);
}

// ---- token buckets (the wte gradient's grouping) ---------------------------------------

// The grouping as the device kernel reads it: every row once, groups ascending by token,
// rows ascending inside a group.
void expect_valid_buckets(const TokenBuckets& b, const std::vector<int32_t>& ids) {
  const auto p = b.packed();
  const int64_t N = b.rows(), G = b.groups();
  ASSERT_EQ(N, static_cast<int64_t>(ids.size()));
  ASSERT_LE(static_cast<int64_t>(p.size()), TokenBuckets::max_packed(N));
  ASSERT_EQ(static_cast<int64_t>(p.size()), 2 * N + 1 + G);
  const int32_t* rows = p.data();
  const int32_t* starts = rows + b.starts_offset();
  const int32_t* tokens = rows + b.tokens_offset();
  EXPECT_EQ(starts[0], 0);
  EXPECT_EQ(starts[G], N);
  std::vector<int> seen(size_t(N), 0);
  for (int64_t g = 0; g < G; ++g) {
    ASSERT_LT(starts[g], starts[g + 1]) << "empty group " << g;
    if (g > 0) {
      EXPECT_LT(tokens[g - 1], tokens[g]);
    }
    for (int32_t k = starts[g]; k < starts[g + 1]; ++k) {
      ASSERT_GE(rows[k], 0);
      ASSERT_LT(rows[k], N);
      EXPECT_EQ(ids[size_t(rows[k])], tokens[g]) << "row " << rows[k] << " in group " << g;
      if (k > starts[g]) {
        EXPECT_LT(rows[k - 1], rows[k]) << "rows out of order in group " << g;
      }
      ++seen[size_t(rows[k])];
    }
  }
  for (int64_t n = 0; n < N; ++n) EXPECT_EQ(seen[size_t(n)], 1) << "row " << n;
}

TEST(TokenBuckets, GroupsEveryRowOnceInRowOrder) {
  TokenBuckets b;
  const std::vector<int32_t> ids = {5, 2, 5, 0, 2, 5, 9};
  b.build(ids, 10);
  EXPECT_EQ(b.groups(), 4);
  const auto p = b.packed();
  EXPECT_EQ(std::vector<int32_t>(p.begin(), p.begin() + 7), (std::vector<int32_t>{3, 1, 4, 0, 2, 5, 6}));
  EXPECT_EQ(std::vector<int32_t>(p.begin() + b.starts_offset(), p.begin() + b.starts_offset() + 5),
            (std::vector<int32_t>{0, 1, 3, 6, 7}));
  EXPECT_EQ(std::vector<int32_t>(p.begin() + b.tokens_offset(), p.end()), (std::vector<int32_t>{0, 2, 5, 9}));
  expect_valid_buckets(b, ids);
  // Reused with another batch and vocabulary: nothing of the previous build leaks through.
  Rng r(11);
  for (const int vocab : {1, 3, 50257}) {
    std::vector<int32_t> many(4096);
    for (auto& x : many) x = static_cast<int32_t>(r.below(uint64_t(vocab)));
    b.build(many, vocab);
    expect_valid_buckets(b, many);
    if (vocab == 1) {
      EXPECT_EQ(b.groups(), 1);
    }
  }
}

TEST(TokenBuckets, SummingGroupsInOrderEqualsTheSequentialWalkBitForBit) {
  // The kernel's order (per group, rows ascending) against the CPU reference's order (rows
  // ascending, each into its token's row): the same float additions, so the same bits.
  const int N = 3000, V = 40, C = 3;
  Rng r(5);
  std::vector<int32_t> ids(N);
  for (auto& x : ids) x = static_cast<int32_t>(r.below(V));
  std::vector<float> dout(size_t(N) * C), base(size_t(V) * C);
  for (auto& x : dout) x = static_cast<float>(r.normal() * std::pow(10.0, double(r.below(7)) - 3));
  for (auto& x : base) x = static_cast<float>(r.normal());
  std::vector<float> seq = base, grouped = base;
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c) seq[size_t(ids[n]) * C + c] += dout[size_t(n) * C + c];
  TokenBuckets b;
  b.build(ids, V);
  const int32_t* rows = b.packed().data();
  const int32_t* starts = rows + b.starts_offset();
  const int32_t* tokens = rows + b.tokens_offset();
  for (int64_t g = 0; g < b.groups(); ++g)
    for (int c = 0; c < C; ++c) {
      float acc = grouped[size_t(tokens[g]) * C + c];
      for (int32_t k = starts[g]; k < starts[g + 1]; ++k) acc += dout[size_t(rows[k]) * C + c];
      grouped[size_t(tokens[g]) * C + c] = acc;
    }
  EXPECT_EQ(grouped, seq);
  // A different (sorted by something else) order would not be: the test can tell.
  float rev = base[0];
  float fwd = base[0];
  for (int n = N - 1; n >= 0; --n)
    if (ids[n] == 0) rev += dout[size_t(n) * C];
  for (int n = 0; n < N; ++n)
    if (ids[n] == 0) fwd += dout[size_t(n) * C];
  EXPECT_NE(rev, fwd) << "inputs too benign to detect an order change";
}

TEST(TokenBuckets, RejectsIdsOutsideTheVocabularyNamingThePosition) {
  TokenBuckets b;
  const std::vector<int32_t> bad = {1, 2, 7, 0};
  try {
    b.build(bad, 7);
    FAIL() << "no exception";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("id 7 at position 2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(b.build(std::vector<int32_t>{-1}, 7), InputError);
  EXPECT_THROW(b.build(std::vector<int32_t>{0}, 0), ConfigError);
}

}  // namespace
}  // namespace geoloco::cuda

namespace geoloco::cuda {

// The op profile's host logic: intervals between marks go to the op each mark names,
// summed per op kind, most expensive first; bad marks are errors, not silent numbers.
TEST(OpTimes, IntervalsBetweenMarksSumPerOp) {
  const std::vector<std::string> labels = {"a", "b", "a", "c", "b"};
  const std::vector<double> times = {10.0, 11.5, 14.0, 14.25, 20.25, 20.5};
  const OpTimes t = op_times_from_marks(labels, times);
  EXPECT_DOUBLE_EQ(t.total_ms(), 10.5);
  const auto rows = t.rows();
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].op, "c");  // 6 ms in one call
  EXPECT_DOUBLE_EQ(rows[0].ms, 6.0);
  EXPECT_EQ(rows[1].op, "b");  // 2.5 + 0.25
  EXPECT_DOUBLE_EQ(rows[1].ms, 2.75);
  EXPECT_EQ(rows[1].calls, 2);
  EXPECT_EQ(rows[2].op, "a");  // 1.5 + 0.25
  EXPECT_DOUBLE_EQ(rows[2].ms, 1.75);
  EXPECT_EQ(t.find("a")->calls, 2);
  EXPECT_EQ(t.find("z"), nullptr);
  const auto j = t.to_json();
  EXPECT_DOUBLE_EQ(j["total_ms"].get<double>(), 10.5);
  ASSERT_EQ(j["ops"].size(), 3u);
  EXPECT_EQ(j["ops"][0]["op"], "c");
  EXPECT_DOUBLE_EQ(j["ops"][0]["share"].get<double>(), 6.0 / 10.5);
  EXPECT_EQ(j["ops"][2]["calls"].get<int>(), 2);
  EXPECT_EQ(op_times_from_marks({}, std::vector<double>{0.0}).rows().size(), 0u);
}

TEST(OpTimes, BadMarksAreErrors) {
  const std::vector<std::string> labels = {"a", "b"};
  EXPECT_THROW(op_times_from_marks(labels, std::vector<double>{0.0, 1.0}), geoloco::Error);  // one time short
  try {
    op_times_from_marks(labels, std::vector<double>{0.0, 2.0, 1.0});
    ADD_FAILURE() << "time going backwards was accepted";
  } catch (const geoloco::Error& e) {
    EXPECT_NE(std::string(e.what()).find("time goes backwards at mark 2 ('b')"), std::string::npos) << e.what();
  }
  OpTimes t;
  EXPECT_THROW(t.add("x", std::numeric_limits<double>::quiet_NaN()), geoloco::Error);
  EXPECT_THROW(t.add("x", -1.0), geoloco::Error);
}

}  // namespace geoloco::cuda

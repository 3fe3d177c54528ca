#!/usr/bin/env bash
# One prepared GPU check (for a machine with a GPU, e.g. one H200 with 16 cores, < 8 minutes):
# configure with CUDA into build-gpu, build only what the check needs, run the device tests
# once in one process (test_cuda_gpu: op and model parity, writes parity.json), the GPT-2 124M
# bf16 benchmark (bench.json, attention auto, with a device-time profile of one step per op
# kind), the training loop on the GPU (test_cuda_loop:
# 2-rank site vs the CPU curve, ddp == zero1, bit-exact resume, 2-site DiLoCo, NCCL in the
# loop), the NCCL tests of the parallel area, the outer loop's round staged in fp32 against
# quantized on the device (outer_stage.json), and last the benchmark with the fused
# attention (bench_fused.json); then write report.json + gpu_check.log into OUTDIR and print the
# report's summary (verdict, figures, the costliest ops) last.
#
#   tools/gpu_check.sh OUTDIR        exit 0 only when every step passed
#
# A machine without geoloco's Debian libraries (the lent H200s have CUDA but no UCX, Gloo, yaml-cpp)
# runs a bundle built elsewhere instead: GEOLOCO_GPU_PREBUILT=ARCHIVE (from tools/gpu_bundle.sh)
# skips configure and build, unpacks it into GEOLOCO_GPU_BUILD (default /tmp/geoloco-gpu-bundle)
# and finds cuBLAS and NCCL on this machine.
#
# Environment: GEOLOCO_GPU_BUILD (build dir, default <repo>/build-gpu),
# GEOLOCO_GPU_ARCH (CMAKE_CUDA_ARCHITECTURES, default 90), GEOLOCO_GPU_BATCH (bench B, 32),
# GEOLOCO_GPU_BUDGET (seconds for the whole check, default 470).
set -uo pipefail
out="${1:?usage: tools/gpu_check.sh OUTDIR}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${GEOLOCO_GPU_BUILD:-$here/build-gpu}"
[[ -n "${GEOLOCO_GPU_PREBUILT:-}" && -z "${GEOLOCO_GPU_BUILD:-}" ]] && build=/tmp/geoloco-gpu-bundle
arch="${GEOLOCO_GPU_ARCH:-90}"
batch="${GEOLOCO_GPU_BATCH:-32}"
budget="${GEOLOCO_GPU_BUDGET:-470}"
jobs="$(nproc)"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
log="$out/gpu_check.log"
: >"$log"
t_start=$(date +%s)
steps=()
failed=0

note() { echo "== $*" | tee -a "$log"; }

# run_step NAME TIMEOUT_S CMD...: runs with a time cap (never past the overall budget),
# records name:rc:seconds. A step that would start with under 10 s left is skipped (rc 124).
run_step() {
  local name="$1" cap="$2"
  shift 2
  local now left t0 rc t1
  now=$(date +%s)
  left=$((budget - (now - t_start)))
  if ((left < 10)); then
    note "$name: skipped, out of time"
    steps+=("$name:124:0")
    failed=1
    return 124
  fi
  ((cap > left)) && cap=$left
  note "$name (cap ${cap}s): $*"
  t0=$(date +%s.%N)
  timeout --kill-after=5 "$cap" "$@" >>"$log" 2>&1
  rc=$?
  t1=$(date +%s.%N)
  local secs
  secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b-a}')
  note "$name: rc $rc in ${secs}s"
  steps+=("$name:$rc:$secs")
  ((rc != 0)) && failed=1
  return "$rc"
}

gpu="$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)"
[[ -z "$gpu" ]] && gpu="unknown (nvidia-smi unavailable)"
note "gpu: $gpu; cores: $jobs; build: $build${GEOLOCO_GPU_PREBUILT:+ (prebuilt from $GEOLOCO_GPU_PREBUILT)}; arch: $arch"
note "system: $(uname -r); $(ldd --version 2>&1 | head -1)"
nvidia-smi >>"$log" 2>&1 || true

# find_cuda_libs: the directories holding the libraries the bundle leaves to this machine (cuBLAS,
# cuBLASLt, NCCL), from CUDA's own folders or the Python wheels (nvidia-*-cu13) a PyTorch image has.
find_cuda_libs() {
  local dirs=() lib d
  for lib in libcublasLt.so.13 libcublas.so.13 libnccl.so.2; do
    d="$(find /usr/local/cuda/ /usr/local/cuda-13*/ /usr/lib/x86_64-linux-gnu /opt /usr/local/lib -name "$lib" \
      -print 2>/dev/null | head -1)"
    if [[ -z "$d" ]]; then
      note "prebuilt: $lib not found on this machine"
      continue
    fi
    d="$(dirname "$d")"
    [[ " ${dirs[*]} " == *" $d "* ]] || dirs+=("$d")
  done
  local IFS=:
  echo "${dirs[*]}"
}

built=0
if [[ -n "${GEOLOCO_GPU_PREBUILT:-}" ]]; then
  # A bundle made by tools/gpu_bundle.sh on a machine with geoloco's dependencies: unpack, and
  # point the loader at its libraries and at this machine's CUDA ones.
  if run_step unpack 60 bash -c "rm -rf '$build' && mkdir -p '$build' && tar -C '$build' -xzf '$GEOLOCO_GPU_PREBUILT'"; then
    cuda_dirs="$(find_cuda_libs)"
    export LD_LIBRARY_PATH="$build/lib${cuda_dirs:+:$cuda_dirs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    note "prebuilt: LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    missing="$(for b in "$build"/tests/trainer/cuda/* "$build"/tests/trainer/parallel/* "$build"/bench/gpu/* "$build"/trainer/cuda/*; do
      ldd "$b" 2>&1 | grep 'not found' | sed "s|^|$(basename "$b"): |"; done)"
    if [[ -n "$missing" ]]; then
      note "prebuilt: libraries not found:"
      echo "$missing" | tee -a "$log"
      steps+=("libraries:1:0")
      failed=1
    else
      built=1
    fi
  fi
elif run_step configure 120 cmake -S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGEOLOCO_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES="$arch" -DGEOLOCO_BUILD_TESTS=ON -DGEOLOCO_BUILD_BENCH=ON; then
  # Only the check's targets: the whole tree would not fit the budget.
  run_step build 300 ninja -C "$build" -j"$jobs" test_cuda_host test_cuda_gpu bench_gpu_gpt2 geoloco_gpu_report \
    test_parallel test_cuda_loop bench_outer_stage && built=1
fi

if ((built)); then
  # Most valuable first, so a slow step costs the later ones, not these: host logic, the
  # device tests once in one process (op/model parity, writes parity.json), the benchmark,
  # then the training loop on the GPU and the NCCL tests.
  run_step host_tests 60 "$build/tests/trainer/cuda/test_cuda_host" --gtest_brief=1
  GEOLOCO_GPU_REPORT_DIR="$out" run_step gpu_tests 150 "$build/tests/trainer/cuda/test_cuda_gpu" --gtest_brief=1
  run_step bench 150 "$build/bench/gpu/bench_gpu_gpt2" --batch "$batch" --steps 20 --warmup 3 --max-seconds 60 --gemm-probe \
    --out "$out/bench.json"
  # site.device: cuda end to end (label gpu_loop).
  run_step loop_tests 120 "$build/tests/trainer/cuda/test_cuda_loop" --gtest_brief=1
  run_step nccl_tests 90 "$build/tests/trainer/parallel/test_parallel" --gtest_filter='Gpu*:Nccl*' --gtest_brief=1
  # The outer loop's round on this GPU: fp32 staging + host quantization against quantization
  # on the device (outer.quantize_on), 64M elements, int4 + EF + zstd 1, same frames.
  run_step outer_stage 60 "$build/bench/gpu/bench_outer_stage" --elements 67108864 --codec int4 --zstd 1 \
    --rounds 5 --out "$out/outer_stage.json"
  # Last (least needed): the benchmark with the fused attention (auto picks the materialized one
  # where its T x T buffers fit, as here), for what each kernel costs, in the same session.
  run_step bench_fused 90 "$build/bench/gpu/bench_gpu_gpt2" --batch "$batch" --steps 10 --warmup 2 \
    --max-seconds 30 --attention fused --out "$out/bench_fused.json"
fi

args=()
for s in "${steps[@]}"; do args+=(--step "$s"); done
tool="$build/trainer/cuda/geoloco_gpu_report"
if [[ -x "$tool" ]]; then
  "$tool" --out "$out/report.json" --gpu "$gpu" --parity "$out/parity.json" --bench "$out/bench.json" "${args[@]}" \
    | tee -a "$log"
  rc=${PIPESTATUS[0]}
else
  # The build failed before the report tool existed: a minimal report by hand.
  {
    printf '{"magic":"geoloco-gpu-check","version":1,"ok":false,"gpu":"%s","steps":[' "${gpu//\"/}"
    sep=""
    for s in "${steps[@]}"; do
      IFS=: read -r n r t <<<"$s"
      printf '%s{"name":"%s","rc":%s,"seconds":%s}' "$sep" "$n" "$r" "$t"
      sep=","
    done
    printf '],"problems":["the build did not produce the report tool; see gpu_check.log"]}\n'
  } >"$out/report.json"
  rc=1
fi
note "total $(( $(date +%s) - t_start ))s; report: $out/report.json"
((failed)) && rc=1
exit "$rc"

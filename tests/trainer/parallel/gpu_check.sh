#!/usr/bin/env bash
# One-shot GPU check for the parallel area (for a machine with a GPU, < 10 minutes):
# configure with CUDA, build only test_parallel, run the GPU tests and a Gloo sanity subset,
# and write a compact report. Usage: tests/trainer/parallel/gpu_check.sh [build-dir] [report-file]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
build="${1:-$here/build-gpu-parallel}"
report="${2:-${OUT:-$build}/parallel_gpu_report.txt}"
mkdir -p "$(dirname "$report")"
{
  echo "== nvidia-smi"; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 || true
  echo "== configure"
  cmake -S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGEOLOCO_CUDA=ON -DGEOLOCO_BUILD_BENCH=OFF \
    -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null
  echo "== build"
  ninja -C "$build" -j"$(nproc)" test_parallel | tail -1
  echo "== GPU tests"
  "$build/tests/parallel/test_parallel" --gtest_filter='Gpu*:Nccl*' --gtest_brief=0 2>&1 | grep -E '^\[|Skipped|Failure|error' || true
  echo "== Gloo sanity"
  "$build/tests/parallel/test_parallel" --gtest_filter='Sizes/GlooRanks.AllReduce*:Gloo.*' 2>&1 | tail -3
} 2>&1 | tee "$report"

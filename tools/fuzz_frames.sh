#!/usr/bin/env bash
# Builds the libFuzzer target for the compressed-frame decoder with clang (ASan + UBSan) into
# build-fuzz/ and runs it for a bounded time. CI: tools/fuzz_frames.sh 60
#
#   tools/fuzz_frames.sh [seconds=60] [extra libFuzzer flags...]
#   GEOLOCO_FUZZ_BUILD=dir   build directory (default <repo>/build-fuzz)
#   GEOLOCO_FUZZ_JOBS=n      ninja -j (default 2)
#
# Starts from the committed corpus (tests/compression/corpus/{valid,malformed,fuzz}) plus
# whatever earlier runs found (build-fuzz/corpus). Exits non-zero when the fuzzer finds a
# crash, a leak, a sanitizer report or a timeout; the input is left in build-fuzz/artifacts/.
# To keep a finding as a regression test: minimise it (-minimize_crash=1 or -merge=1), then
# copy it to tests/compression/corpus/fuzz/ (test_corpus replays every file there).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
seconds="${1:-60}"
shift || true
build="${GEOLOCO_FUZZ_BUILD:-$here/build-fuzz}"
jobs="${GEOLOCO_FUZZ_JOBS:-2}"

if ! command -v clang++ >/dev/null; then
  echo "fuzz_frames: clang++ not found (apt-get install clang libclang-rt-14-dev)" >&2
  exit 2
fi

mkdir -p "$build"
CC=clang CXX=clang++ cmake -S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DGEOLOCO_FUZZ=ON -DGEOLOCO_SANITIZE=address -DGEOLOCO_CUDA=OFF \
  -DGEOLOCO_BUILD_TESTS=OFF -DGEOLOCO_BUILD_BENCH=OFF >"$build/configure.log" 2>&1 \
  || { tail -30 "$build/configure.log" >&2; exit 1; }
ninja -C "$build" -j "$jobs" compression_fuzz_frame

mkdir -p "$build/corpus" "$build/artifacts"
seeds=()
for d in valid malformed fuzz; do
  [[ -d "$here/tests/compression/corpus/$d" ]] && seeds+=("$here/tests/compression/corpus/$d")
done

# ASan's leak check and UBSan's reports must fail the run, not just print.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}"
exec "$build/compression/compression_fuzz_frame" \
  -max_total_time="$seconds" -max_len=70000 -timeout=10 -rss_limit_mb=2048 \
  -artifact_prefix="$build/artifacts/" -print_final_stats=1 "$@" \
  "$build/corpus" "${seeds[@]}"

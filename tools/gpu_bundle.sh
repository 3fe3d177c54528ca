#!/usr/bin/env bash
# Packs what tools/gpu_check.sh runs into one archive, for a GPU machine that has CUDA but none of
# geoloco's Debian libraries (UCX, Gloo, yaml-cpp, OpenBLAS, ...) and cannot fetch them: the check's
# binaries, built here for sm_90, in the build tree's layout, plus every shared library they load
# except glibc's own and CUDA's large ones (cuBLAS, cuBLASLt, NCCL, the driver), which the GPU
# machine's CUDA 13 provides (gpu_check.sh finds them there).
#
#   tools/gpu_bundle.sh [BUILD_DIR] [ARCHIVE]   default: build, .gpu/bundle.tar.gz
#
# Then on the GPU machine: GEOLOCO_GPU_PREBUILT=.gpu/bundle.tar.gz tools/gpu_check.sh OUTDIR
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$here/build}"
archive="${2:-$here/.gpu/bundle.tar.gz}"
targets=(tests/trainer/cuda/test_cuda_host tests/trainer/cuda/test_cuda_gpu tests/trainer/cuda/test_cuda_loop tests/trainer/parallel/test_parallel
  bench/gpu/bench_gpu_gpt2 bench/gpu/bench_outer_stage trainer/cuda/geoloco_gpu_report)

die() { echo "gpu_bundle: $*" >&2; exit 2; }
[[ -f "$build/CMakeCache.txt" ]] || die "$build is not a configured build directory (run tools/setup.sh first)"
names=()
for t in "${targets[@]}"; do names+=("$(basename "$t")"); done
ninja -C "$build" "${names[@]}" >/dev/null
# The device code must hold sm_90 machine code (CMAKE_CUDA_ARCHITECTURES 90, the default).
cuobjdump="${CUDA_HOME:-/usr/local/cuda}/bin/cuobjdump"
if [[ -x "$cuobjdump" ]]; then
  arch="$("$cuobjdump" --list-elf "$build/tests/trainer/cuda/test_cuda_gpu" 2>/dev/null | grep -o 'sm_[0-9]*' | sort -u | tr '\n' ' ')"
  [[ "$arch" == *sm_90* ]] || die "$build/tests/trainer/cuda/test_cuda_gpu holds no sm_90 code (found: ${arch:-none}); reconfigure with -DCMAKE_CUDA_ARCHITECTURES=90"
else
  arch="unchecked (no cuobjdump)"
fi

stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/lib"
for t in "${targets[@]}"; do
  mkdir -p "$stage/$(dirname "$t")"
  cp "$build/$t" "$stage/$t"
  strip --strip-debug "$stage/$t"
done

# Every library the binaries load, less glibc's and the ones the GPU machine has (and must match
# its driver): libcuda, cuBLAS(Lt), NCCL. libcudart is small and matches the build: it travels.
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libcuda\.so|libcublas|libcublasLt|libnccl)'
declare -A seen=()
for t in "${targets[@]}"; do
  while read -r name _ path _; do
    [[ -z "$path" || "$path" == "not" ]] && die "$t: $name is not found here (ldd)"
    [[ "$name" =~ $skip ]] && continue
    [[ -n "${seen[$name]:-}" ]] && continue
    seen[$name]="$path"
    cp -L "$path" "$stage/lib/$name"
  done < <(ldd "$build/$t" | awk '$2 == "=>" {print $1, $2, $3, $4}')
done
# UCX loads its transports from <dir of libucs>/ucx at run time.
ucs="${seen[libucs.so.0]:-}"
if [[ -n "$ucs" && -d "$(dirname "$(readlink -f "$ucs")")/ucx" ]]; then
  cp -rL "$(dirname "$(readlink -f "$ucs")")/ucx" "$stage/lib/ucx"
fi

mkdir -p "$(dirname "$archive")"
tar -C "$stage" -czf "$archive" .
echo "gpu_bundle: $archive ($(du -h "$archive" | cut -f1), arch $arch, ${#seen[@]} libraries)"

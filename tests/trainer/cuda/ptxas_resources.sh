#!/usr/bin/env bash
# Static check of the device code, no GPU needed: compiles each kernel file for the build's
# architecture with `ptxas -v` and fails when a kernel spills registers to local memory, keeps
# a stack frame (arrays indexed at run time, e.g. fragment arrays with a loop bound ptxas
# cannot see), or asks for more than 48 KiB of static shared memory (the launch would fail).
# Prints one line per kernel: registers, stack, spills, shared memory.
#
#   ptxas_resources.sh NVCC ARCH SOURCE_DIR INCLUDE_DIR... -- FILE.cu...
set -euo pipefail
nvcc="$1" arch="$2" src="$3"
shift 3
incs=()
while [[ $# -gt 0 && "$1" != "--" ]]; do
  incs+=("-I$1")
  shift
done
shift
status=0
for f in "$@"; do
  log="$(mktemp)"
  "$nvcc" -std=c++20 -O3 -arch="sm_$arch" -Xptxas -v -I"$src" "${incs[@]}" -c "$src/$f" -o /dev/null >"$log" 2>&1 || {
    cat "$log"
    echo "FAIL: $f does not compile"
    exit 1
  }
  # ptxas prints, per entry: "Compiling entry function 'NAME'", then "N bytes stack frame, S bytes
  # spill stores, L bytes spill loads", then "Used R registers, ..., M bytes smem" (smem omitted at 0).
  awk -v file="$f" '
    /Compiling entry function/ { name = $0; sub(/.*function .?/, "", name); sub(/.? for .*/, "", name); next }
    /bytes stack frame/ { stack = $1; spill_st = $5; spill_ld = $9; next }
    /Used [0-9]+ registers/ {
      regs = $0; sub(/.*Used /, "", regs); sub(/ registers.*/, "", regs)
      smem = 0; if ($0 ~ /bytes smem/) { smem = $0; sub(/ bytes smem.*/, "", smem); sub(/.*, /, "", smem) }
      printf "%s %s: %s registers, stack %s, spills %s/%s, smem %s\n", file, name, regs, stack, spill_st, spill_ld, smem
      if (stack + 0 > 0 || spill_st + 0 > 0 || spill_ld + 0 > 0 || smem + 0 > 49152) { bad = 1; print "  ^ FAIL: local memory or shared memory over 48 KiB" }
      n++
    }
    END { if (n == 0) { print "FAIL: no kernel found in " file; exit 1 } exit bad }
  ' "$log" | c++filt
  ((PIPESTATUS[0] == 0)) || status=1
  rm -f "$log"
done
exit "$status"

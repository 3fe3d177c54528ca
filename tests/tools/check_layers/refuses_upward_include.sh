#!/usr/bin/env bash
# The layering check on a small tree: the outer loop including the inner loop must fail it
# (exit 1) naming the file, the line and the edge; the same tree without that include passes.
set -euo pipefail
check="$1"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/outer_optimizer" "$tmp/core" "$tmp/trainer/loop"
printf '#include "core/error.hpp"\n' >"$tmp/outer_optimizer/ok.cpp"
printf '#include "core/error.hpp"\n#include "outer_optimizer/ok.hpp"\n' >"$tmp/trainer/loop/driver.cpp"
python3 "$check" --root "$tmp" || { echo "FAIL: a tree that follows the direction was refused"; exit 1; }
printf '// the weld\n#include "trainer/loop/run_config.hpp"\n' >"$tmp/outer_optimizer/weld.cpp"
set +e
out="$(python3 "$check" --root "$tmp" 2>&1)"
rc=$?
set -e
echo "$out"
[[ $rc -eq 1 ]] || { echo "FAIL: exit $rc, expected 1"; exit 1; }
grep -q 'outer_optimizer/weld.cpp:2: outer_optimizer may not include trainer/loop (trainer/loop/run_config.hpp)' <<<"$out" \
  || { echo "FAIL: the message does not name the file, line and edge"; exit 1; }
echo "ok: the upward include was refused"

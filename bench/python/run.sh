#!/usr/bin/env bash
# The Python package's outer loop against the native one (issue "geoloco for PyTorch users":
# within 10%): the same outer loop, the same sites, link and compression, at 25M and 100M
# parameters, behind stand-in inner steps on both sides (the native trainer's rehearsal,
# train.rehearsal; bench/python/stand_in.py for the package: a drift, then a sleep to the same
# step time). Per run: the ranks' mean sync time (sync_seconds_mean: a round from snapshot to
# merge) and the time the inner loop was blocked in the outer loop (exposed_wait_s), averaged
# over the ranks. Alternated native / package BENCH_RUNS times per size; medians.
#
#   bench/python/run.sh [--allow-load] [path/to/geoloco]
#
# Environment: bench/lib.sh's (BENCH_RUNS >= 5), SIZES ("25 100", millions), STEPS (40),
# STEP_S (0.2), KEEP=1. Prints ONE JSON document on stdout.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
source "$root/bench/lib.sh"
bench_init "$@"
set -- "${bench_args[@]}"
geoloco="$(readlink -f "${1:-$root/build/geoloco}")"
[[ -x "$geoloco" ]] || { echo "run.sh: no geoloco binary at $geoloco" >&2; exit 2; }
read -r -a sizes <<<"${SIZES:-25 100}"
steps="${STEPS:-40}"
step_s="${STEP_S:-0.2}"
out="$(mktemp -d /tmp/geoloco-bench-python.XXXXXX)"
cleanup() { if [[ "${KEEP:-0}" == 1 ]]; then echo "run.sh: kept $out" >&2; else rm -rf "$out"; fi; }
trap cleanup EXIT

# A GPT-2 of about M million parameters: 12 L d^2 + V d with V 8192, d 1024 (25M: 1 layer, 100M: 7).
common() {  # the sites, outer loop and transport both sides share
  cat <<YAML
train: {steps: $steps, log_every: 10}
sites:
  - {name: paris, ranks: 1, port: $2}
  - {name: lyon, ranks: 1, port: $(($2 + 10))}
outer:
  interval: 10
  compression: {codec: int8, block: 4096, error_feedback: false, zstd_level: 0}
transport: {psk_file: $root/configs/demo.psk, timeout_s: 300}
YAML
}
port=$((30000 + RANDOM % 20000))
for m in "${sizes[@]}"; do
  layers=$(((m * 1000000 - 8192 * 1024 - 1024 * 1024) / (12 * 1024 * 1024)))
  ((layers >= 1)) || layers=1
  {
    echo "run: {name: native-$m, seed: 1, output_dir: $out/native-$m}"
    echo "model: {n_layer: $layers, n_head: 16, n_embd: 1024, block_size: 1024, vocab_size: 8192}"
    echo "data: {train: {kind: synthetic, vocab: 8192, tokens: 1048576}}"
    common "$m" "$port" | sed "s#train: {steps: $steps, log_every: 10}#train: {steps: $steps, log_every: 10, rehearsal: {step_seconds: $step_s, drift: 1.0e-5}}#"
  } >"$out/native-$m.yaml"
  port=$((port + 40))
done

for ((r = 1; r <= BENCH_RUNS; ++r)); do
  for m in "${sizes[@]}"; do
    rm -rf "$out/native-$m"
    "$geoloco" launch "$out/native-$m.yaml" --plain >"$out/native-$m.r$r.log" 2>&1
    cp "$out/native-$m/summary.json" "$out/native-$m.r$r.json"
    params=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['params'])" "$out/native-$m.r$r.json")
    port=$((30000 + RANDOM % 20000))
    {
      echo "run: {name: package-$m, output_dir: $out/package-$m, command: [/usr/bin/python3, $here/stand_in.py]}"
      common "$m" "$port"
    } >"$out/package-$m.yaml"
    rm -rf "$out/package-$m"
    BENCH_PARAMS="$params" BENCH_STEP_S="$step_s" \
      "$geoloco" launch "$out/package-$m.yaml" --plain >"$out/package-$m.r$r.log" 2>&1
    cp "$out/package-$m/summary.json" "$out/package-$m.r$r.json"
  done
done
bench_finish
python3 "$here/summarize.py" "$out" "${sizes[@]}"

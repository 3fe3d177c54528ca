#!/usr/bin/env bash
# Captures real pseudo-gradients from a short geoloco multi-site run (2 sites x 2 ranks, the
# demo config with a ~4.8 M-parameter model) and benchmarks every codec on 64 MiB of them.
#
#   bench/compression/capture.sh [OUT_DIR]        (default /tmp/geoloco-capture)
#
# Environment: BUILD (build directory holding geoloco and bench/compression/bench_codecs;
# default build), STEPS (inner steps, default 30), INTERVAL (H, default 10), PORT (first
# port; sites use PORT and PORT+100, ranks add their index; default 31500), REPS (bench
# repetitions, default 3), ZSTD (levels, default 0,1).
#
# Writes OUT_DIR/run/ (summary.json of the run), OUT_DIR/capture/*.safetensors (every rank's
# shard of every outer round), OUT_DIR/real64.f32 (64 MiB of them, concatenated by
# concat_pseudograds.py) and OUT_DIR/bench.json (bench_codecs on synthetic and real data);
# prints bench.json on stdout. The run takes ~1.5 min and bench_codecs ~1 min of CPU time;
# at a load average of 20-25 on 2 cores the benchmark took ~10 min of wall time (its
# figures are thread CPU time, so they hold regardless).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
build="${BUILD:-$repo/build}"
out="${1:-/tmp/geoloco-capture}"
steps="${STEPS:-30}"
interval="${INTERVAL:-10}"
port="${PORT:-31500}"
reps="${REPS:-3}"
zstd="${ZSTD:-0,1}"

geoloco="$build/geoloco"
bench="$build/bench/compression/bench_codecs"
for b in "$geoloco" "$bench"; do
  [[ -x "$b" ]] || { echo "capture.sh: $b not built (ninja -C $build geoloco bench_codecs)" >&2; exit 2; }
done

# A stale capture would be mixed into the concatenation: start from an empty directory.
rm -rf "$out/capture" "$out/run"
mkdir -p "$out/capture"

# 6 layers x d 256 (4.83 M parameters): each rank's shard is ~2.4 M values, so 2 sites x
# 2 ranks x 2 rounds already exceed 64 MiB; the newest rounds are used. Short sequences and
# micro-batches keep a step cheap on 2 cores. Everything else is configs/demo.yaml.
echo "capture.sh: $steps steps, H=$interval, 2 sites x 2 ranks, capture in $out/capture" >&2
"$geoloco" launch "$repo/configs/demo.yaml" --capture-pseudograd "$out/capture" \
  --set run.output_dir="$out/run" --set run.name=capture \
  --set model.n_layer=6 --set model.n_embd=256 --set model.n_head=8 --set model.block_size=64 \
  --set train.micro_batch=4 --set train.steps="$steps" --set train.eval_every=0 \
  --set train.eval_batches=1 --set train.checkpoint_every=0 \
  --set train.schedule.warmup_steps=5 \
  --set outer.interval="$interval" \
  --set outer.compression.codec=fp32 --set outer.compression.error_feedback=false \
  --set outer.compression.zstd_level=0 \
  --set sites.0.port="$port" --set sites.1.port="$((port + 100))" >&2

/usr/bin/python3 "$here/concat_pseudograds.py" "$out/capture" "$out/real64.f32" --mib 64 >&2
"$bench" --mib 64 --reps "$reps" --zstd "$zstd" --real "$out/real64.f32" > "$out/bench.json"
cat "$out/bench.json"

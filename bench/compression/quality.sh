#!/usr/bin/env bash
# Training-quality table: the same short multi-site run (configs/demo.yaml as 2 sites x
# 1 rank, same seed, same data order) once per outer-compression codec, against the
# uncompressed (fp32) run, plus fp32 runs with other seeds to show the run-to-run spread.
#
#   bench/compression/quality.sh [OUT_DIR]        (default /tmp/geoloco-quality)
#
# Environment: BUILD (build directory holding geoloco; default build), STEPS (inner steps,
# default 250), INTERVAL (H, default 10), SEED (default 1234), NOISE_SEEDS (extra fp32
# seeds, default "1235"), EVAL_BATCHES (validation micro-batches per rank, default 16),
# BLOCK_SIZE (model context, default 64: half the demo's, so a run takes 1-3 minutes here
# and the whole table 10-17 minutes),
# PORT (first port, default 32500; each run moves up by 10), ONLY (space-separated run
# names to run, default all; runs of the list already in OUT_DIR stay in the report).
#
# Prints ONE JSON document on stdout (also OUT_DIR/quality.json): per run the final
# validation loss, its relative difference from the fp32 run with the same seed, the
# compression ratio and WAN bytes; the seed spread of fp32; and whether "4-bit with error
# feedback within 1% of the uncompressed run's final validation loss" holds. Each run's
# summary.json and log are kept under OUT_DIR/<name>/.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
build="${BUILD:-$repo/build}"
out="${1:-/tmp/geoloco-quality}"
steps="${STEPS:-250}"
interval="${INTERVAL:-10}"
seed="${SEED:-1234}"
noise_seeds="${NOISE_SEEDS:-1235}"
eval_batches="${EVAL_BATCHES:-16}"
port="${PORT:-32500}"
block="${BLOCK_SIZE:-64}"
only="${ONLY:-}"

geoloco="$build/geoloco"
[[ -x "$geoloco" ]] || { echo "quality.sh: $geoloco not built (ninja -C $build geoloco)" >&2; exit 2; }
mkdir -p "$out"

# name codec error_feedback zstd_level seed. zstd is on (level 1, the recommended level)
# for the 4-bit and 2-bit codecs where it pays, off for the others (docs/compression.md).
runs=("fp32 fp32 false 0 $seed")
for s in $noise_seeds; do runs+=("fp32_seed$s fp32 false 0 $s"); done
runs+=(
  "fp16 fp16 true 0 $seed"
  "bf16 bf16 true 0 $seed"
  "int8 int8 true 0 $seed"
  "int4_noef int4 false 1 $seed"
  "int4_ef int4 true 1 $seed"
  "fp4_noef fp4 false 1 $seed"
  "fp4_ef fp4 true 1 $seed"
  "int2_ef int2 true 1 $seed"
)

names=()
for r in "${runs[@]}"; do
  read -r name codec ef zstd s <<<"$r"
  # The report covers every run of the list already in OUT_DIR, so ONLY can add runs to an
  # earlier table; the report refuses runs of a different length or H.
  [[ -f "$out/$name/run/summary.json" ]] && names+=("$name")
  if [[ -n "$only" && " $only " != *" $name "* ]]; then continue; fi
  [[ " ${names[*]} " == *" $name "* ]] || names+=("$name")
  dir="$out/$name"
  rm -rf "$dir"
  mkdir -p "$dir"
  t0=$(date +%s)
  # Fresh ports per run: a just-closed UCX listener port can stay busy for a while.
  if ! "$geoloco" launch "$repo/configs/demo.yaml" \
      --set run.output_dir="$dir/run" --set run.name="quality-$name" --set run.seed="$s" \
      --set train.steps="$steps" --set train.eval_every=0 --set train.eval_batches="$eval_batches" \
      --set train.checkpoint_every=0 --set outer.interval="$interval" --set model.block_size="$block" \
      --set outer.compression.codec="$codec" --set outer.compression.error_feedback="$ef" \
      --set outer.compression.zstd_level="$zstd" \
      --set sites.0.ranks=1 --set sites.1.ranks=1 \
      --set sites.0.port="$port" --set sites.1.port="$((port + 5))" \
      >"$dir/log.txt" 2>&1; then
    echo "quality.sh: run $name failed; last lines of $dir/log.txt:" >&2
    tail -n 20 "$dir/log.txt" >&2
    exit 1
  fi
  echo "quality.sh: $name done in $(( $(date +%s) - t0 )) s" >&2
  port=$((port + 10))
done

/usr/bin/python3 - "$out" "$seed" "$steps" "$interval" "$eval_batches" "$block" "${names[@]}" >"$out/quality.json.tmp" <<'EOF'
import json, sys
out, seed, steps, interval, eval_batches, names = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[7:]
rows = {}
for n in names:
    s = json.load(open(f"{out}/{n}/run/summary.json"))
    if not s.get("completed"):
        raise SystemExit(f"quality: run {n} did not complete")
    if s["steps"] != steps or s.get("outer_steps") != steps // interval + (steps % interval > 0):
        raise SystemExit(f"quality: run {n} in {out} has {s['steps']} steps and {s.get('outer_steps')} outer steps, "
                         f"not {steps} and H={interval}: use another OUT_DIR")
    rows[n] = {"val_loss": s["val_loss"], "final_loss": s["final_loss"], "steps": s["steps"],
               "outer_steps": s.get("outer_steps"), "compression_ratio": s.get("compression_ratio"),
               "wire_bytes_per_outer_step": s.get("wire_bytes_per_outer_step"),
               "wan_bytes_sent_total": s.get("wan_bytes_sent_total"), "wall_s": s.get("wall_s"),
               "params": s.get("params"), "params_hash": s.get("params_hash")}
doc = {"bench": "compression quality", "peer": "fp32 (uncompressed outer exchange), same seed",
       "setup": {"config": "configs/demo.yaml", "sites": 2, "ranks_per_site": 1, "steps": steps,
                 "outer_interval": interval, "block_size": int(sys.argv[6]), "seed": seed, "eval_batches_per_rank": eval_batches},
       "runs": rows}
if "fp32" in rows:
    ref = rows["fp32"]["val_loss"]
    for n, r in rows.items():
        r["rel_diff_vs_fp32"] = (r["val_loss"] - ref) / ref
    seeds = [r["val_loss"] for n, r in rows.items() if n == "fp32" or n.startswith("fp32_seed")]
    if len(seeds) > 1:
        mean = sum(seeds) / len(seeds)
        sd = (sum((v - mean) ** 2 for v in seeds) / (len(seeds) - 1)) ** 0.5
        doc["fp32_seed_spread"] = {"val_losses": seeds, "max_minus_min_rel": (max(seeds) - min(seeds)) / mean,
                                   "stddev_rel": sd / mean}
    targets = []
    for n in ("int4_ef", "fp4_ef"):
        if n in rows:
            d = rows[n]["rel_diff_vs_fp32"]
            targets.append({"target": "4-bit with error feedback within 1% of uncompressed final val loss",
                            "run": n, "geoloco": rows[n]["val_loss"], "peer": ref, "rel_diff": d,
                            "goal": 0.01, "met": abs(d) <= 0.01})
    doc["targets"] = targets
print(json.dumps(doc, indent=2))
EOF
# Only a complete report replaces the previous one.
mv "$out/quality.json.tmp" "$out/quality.json"
cat "$out/quality.json"

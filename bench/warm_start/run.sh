#!/usr/bin/env bash
# Warm-start benchmark: how much of DiLoCo's gap to synchronous training a short synchronous
# phase closes (train.init_from). The demo model and data (configs/demo.yaml: GPT 4 x 128,
# 0.84M params, byte-level licence texts, H = 50, int8 + error feedback + zstd), the same
# number of steps and tokens in every run (global batch 32 sequences):
#
#   sync       the peer: synchronous data parallelism, one site of 2 ranks x 2 accumulation
#              steps (configs/warm-start.yaml), STEPS steps
#   cold       DiLoCo from the seeded init: configs/demo.yaml, 2 sites x 2 ranks, STEPS steps
#   warm W     the sync run's checkpoint at step W (the same run: its first W steps), then
#              DiLoCo for STEPS - W steps with train.init_from (fresh AdamW moments, a new
#              cosine schedule with WARM_WARMUP warmup steps)
#
#   bench/warm_start/run.sh [path/to/geoloco]            (default: build/geoloco)
#
# Prints ONE JSON document on stdout (progress on stderr): each run's final validation loss,
# its ratio to the peer's, and for the warm runs the fraction of the cold run's gap closed
# ((cold - warm) / (cold - sync)).
#
# Environment: STEPS (300), WARM (space-separated W values, multiples of 30; default
# "30 60 150"), WARM_WARMUP (10), PORT_BASE (29850), KEEP=1 keeps the runs (path on stderr).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
geoloco="$(readlink -f "${1:-$root/build/geoloco}")"
[[ -x "$geoloco" ]] || { echo "run.sh: no geoloco binary at $geoloco (build it, or pass its path)" >&2; exit 2; }
steps="${STEPS:-300}"
read -r -a warm <<<"${WARM:-30 60 150}"
warm_warmup="${WARM_WARMUP:-10}"
port_base="${PORT_BASE:-29850}"
for w in "${warm[@]}"; do
  if ! [[ "$w" =~ ^[0-9]+$ ]] || ((w % 30 != 0 || w <= 0 || w >= steps)); then
    echo "run.sh: WARM value '$w' must be a multiple of 30 (the sync run's checkpoint interval) in (0, $steps)" >&2
    exit 2
  fi
done

out="$(mktemp -d /tmp/geoloco-bench-warm.XXXXXX)"
cleanup() { if [[ "${KEEP:-0}" == 1 ]]; then echo "run.sh: kept $out" >&2; else rm -rf "$out"; fi; }
trap cleanup EXIT

# launch NAME CONFIG ARGS...: one run into $out/NAME (log next to it); its output on failure.
launch() {
  local name="$1" config="$2"
  shift 2
  echo "run.sh: $name" >&2
  if ! "$geoloco" launch "$config" --set "run.output_dir=$out/$name" --set "train.steps=$steps" "$@" \
      >"$out/$name.log" 2>&1; then
    echo "run.sh: run '$name' failed; its output:" >&2
    tail -40 "$out/$name.log" >&2
    exit 1
  fi
}

load_before="$(cut -d' ' -f1-3 /proc/loadavg)"
# Every checkpoint of the sync run is kept: the warm runs start from them.
launch sync "$root/configs/warm-start.yaml" --set "sites.0.port=$port_base" \
  --set train.checkpoint_every=30 --set "train.keep_checkpoints=$((steps / 30 + 1))"
demo=(--set "sites.0.port=$((port_base + 10))" --set "sites.1.port=$((port_base + 20))" --set train.checkpoint_every=0)
launch cold "$root/configs/demo.yaml" "${demo[@]}"
runs=(sync "$out/sync" 0 cold "$out/cold" 0)
for w in "${warm[@]}"; do
  ckpt="$(printf '%s/sync/checkpoints/local/step_%08d' "$out" "$w")"
  launch "warm$w" "$root/configs/demo.yaml" "${demo[@]}" --set "train.init_from=$ckpt" \
    --set "train.steps=$((steps - w))" --set "train.schedule.warmup_steps=$warm_warmup"
  runs+=("warm$w" "$out/warm$w" "$w")
done
load_after="$(cut -d' ' -f1-3 /proc/loadavg)"

/usr/bin/python3 "$here/summarize.py" --steps "$steps" --warm-warmup "$warm_warmup" --nproc "$(nproc)" \
  --load-before "$load_before" --load-after "$load_after" -- "${runs[@]}"

#!/usr/bin/env bash
# Re-warmup of a joiner (outer.join_warmup_steps): what a fresh inner AdamW does to the first
# pseudo-gradient a rejoined site sends, and to the run's final validation loss.
#
# Each run: configs/elastic.yaml (three sites of one rank, H = 25, 300 steps) under
# `geoloco launch`; site lyon is SIGKILLed once outer step 3 is logged, the launcher restarts it
# (--restart-backoff-s 1) with --join, a round takes it in and it trains on from the committed
# state with a fresh AdamW. Per run:
#   first_pg_ratio   the norm of lyon's first pseudo-gradient after the join, over the mean
#                    norm of the other sites' in the same round (rounds.r0.jsonl, ref2);
#                    before the kill this ratio is about 1
#   steady_pg_ratio  the same ratio averaged over lyon's rounds before the kill
#   val_loss         the run's final validation loss (every site's model is the same)
# for every re-warmup W in WARMUPS and seed in SEEDS. The peer is W = 0 (no re-warmup: what
# a joiner did before the option existed); the JSON gives each figure's mean, its spread over
# the seeds, and its ratio to the peer's mean.
#
#   bench/elastic/rewarm.sh [path/to/geoloco]      (default: build/geoloco)
#
# A quality benchmark (losses and norms, not times): no load gate, but the load average before
# and after is recorded, since the round lyon rejoins at depends on how fast the sites run.
#
# Environment: WARMUPS ("0 6 12 25"), SEEDS ("1 2 3"), STEPS (300), PORT_BASE (29700),
# KEEP=1 keeps the runs (path on stderr). Prints ONE JSON document on stdout.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
geoloco="$(readlink -f "${1:-$root/build/geoloco}")"
[[ -x "$geoloco" ]] || { echo "rewarm.sh: no geoloco binary at $geoloco (build it, or pass its path)" >&2; exit 2; }
read -r -a warmups <<<"${WARMUPS:-0 6 12 25}"
read -r -a seeds <<<"${SEEDS:-1 2 3}"
steps="${STEPS:-300}"
port_base="${PORT_BASE:-29700}"
config="$root/configs/elastic.yaml"

out="$(mktemp -d /tmp/geoloco-bench-rewarm.XXXXXX)"
cleanup() { if [[ "${KEEP:-0}" == 1 ]]; then echo "rewarm.sh: kept $out" >&2; else rm -rf "$out"; fi; }
trap cleanup EXIT

# one NAME SEED W: one run into $out/NAME, lyon killed after outer step 3 and rejoined.
one() {
  local name="$1" seed="$2" w="$3" log="$out/$1.log"
  echo "rewarm.sh: $name" >&2
  (cd "$root" && "$geoloco" launch "$config" --plain --restart-backoff-s 1 \
    --set "run.output_dir=$out/$name" --set "run.seed=$seed" --set "train.steps=$steps" \
    --set "outer.join_warmup_steps=$w" --set "sites.0.port=$port_base" \
    --set "sites.1.port=$((port_base + 10))" --set "sites.2.port=$((port_base + 20))") >"$log" 2>&1 &
  local launch=$!
  until grep -q "outer step 3 at inner step" "$log" 2>/dev/null; do
    kill -0 "$launch" 2>/dev/null || break
    sleep 0.1
  done
  local pid
  pid="$(pgrep -f "worker $config --site lyon" | head -1 || true)"
  [[ -n "$pid" ]] && kill -KILL "$pid"
  if ! wait "$launch"; then
    echo "rewarm.sh: run '$name' failed; its output:" >&2
    tail -40 "$log" >&2
    exit 1
  fi
  if [[ -z "$pid" ]]; then
    echo "rewarm.sh: run '$name': lyon's process was not found to kill" >&2
    exit 1
  fi
}

load_before="$(cut -d' ' -f1-3 /proc/loadavg)"
runs=()
for seed in "${seeds[@]}"; do
  # Alternated: every re-warmup, then the next seed.
  for w in "${warmups[@]}"; do
    one "s${seed}_w${w}" "$seed" "$w"
    runs+=("$w" "$seed" "$out/s${seed}_w${w}")
  done
done
load_after="$(cut -d' ' -f1-3 /proc/loadavg)"

/usr/bin/python3 "$here/rewarm_summary.py" --steps "$steps" --nproc "$(nproc)" --load-before "$load_before" \
  --load-after "$load_after" -- "${runs[@]}"

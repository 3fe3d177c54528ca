#!/usr/bin/env bash
# Overlap benchmark: compute utilization and final validation loss of the demo model
# (configs/demo.yaml: GPT 4 layers x 128, 0.84M params, 300 steps, H = 50, int8 + error
# feedback + zstd) on 2 sites x 1 rank, over a grid of (fragments F, overlap tau or delayed
# update, added one-way delay, rate cap per site pair). The delay and the cap come from the
# transport's test hook (`transport.emulate`: every cross-site chunk arrives delay_ms late,
# paced at rate_mbit), so the grid runs on any machine; tools/wan/ emulates the network
# itself. Every run sets eval_every 0 and checkpoint_every 0 (one evaluation at the end) so
# utilization measures what the outer loop costs, not what evaluation costs.
#
#   bench/overlap/run.sh [--allow-load] [path/to/geoloco]            (default: build/geoloco)
#
# The discipline of bench/lib.sh: refuses to start above load average 1.0 unless --allow-load
# (then "loaded": true); the whole grid runs BENCH_RUNS (5) times in turn, so every point
# alternates with its peer; each figure is the median over the repeats, with min and max.
#
# Prints ONE JSON document on stdout (progress on stderr): per grid point the steady-state
# compute utilization (every outer period but the last, whose blocking end-of-run sync no
# schedule can hide), the whole-run utilization, exposed wait, final validation loss, and
# the ratios to the named peer: the blocking run (F 1, tau 0) on the same link.
#
# Environment: GRID (space-separated F:tau:delayed:delay_ms:rate_mbit points; default below),
# STEPS (300), INTERVAL (50), BENCH_RUNS (5), PORT_BASE (29700; run i takes PORT_BASE + 20 i and
# + 10), KEEP=1 keeps the runs (path on stderr).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
source "$root/bench/lib.sh"
bench_init "$@"
set -- "${bench_args[@]}"
geoloco="$(readlink -f "${1:-$root/build/geoloco}")"
[[ -x "$geoloco" ]] || { echo "run.sh: no geoloco binary at $geoloco (build it, or pass its path)" >&2; exit 2; }

# 100 ms RTT (50 ms each way) at 1 Gbit/s: the issue's target link; 500 ms RTT at 100 Mbit/s:
# a hostile one.
grid=(${GRID:-1:0:0:50:1000 1:5:0:50:1000 4:0:0:50:1000 4:5:0:50:1000 1:0:1:50:1000 1:0:0:250:100 4:10:0:250:100})
steps="${STEPS:-300}"
interval="${INTERVAL:-50}"
port_base="${PORT_BASE:-29700}"

out="$(mktemp -d /tmp/geoloco-bench-overlap.XXXXXX)"
cleanup() { if [[ "${KEEP:-0}" == 1 ]]; then echo "run.sh: kept $out" >&2; else rm -rf "$out"; fi; }
trap cleanup EXIT

runs=()
i=0
for ((rep = 0; rep < BENCH_RUNS; rep++)); do
for point in "${grid[@]}"; do
  IFS=: read -r F tau delayed delay rate <<<"$point"
  [[ -n "$rate" ]] || { echo "run.sh: grid point '$point' is not F:tau:delayed:delay_ms:rate_mbit" >&2; exit 2; }
  dir="$out/p$i"
  port=$((port_base + 20 * i))
  i=$((i + 1))
  delayed_bool=false
  [[ "$delayed" == 1 ]] && delayed_bool=true
  echo "run.sh: round $rep: F=$F tau=$tau delayed=$delayed_bool delay=${delay}ms rate=${rate}Mbit/s (port $port)" >&2
  if ! "$geoloco" launch "$root/configs/demo.yaml" \
        --set "sites.0.ranks=1" --set "sites.1.ranks=1" \
        --set "sites.0.port=$port" --set "sites.1.port=$((port + 10))" \
        --set "train.steps=$steps" --set "train.eval_every=0" --set "train.checkpoint_every=0" \
        --set "outer.interval=$interval" --set "outer.fragments=$F" \
        --set "outer.overlap_steps=$tau" --set "outer.delayed_update=$delayed_bool" \
        --set "transport.emulate.delay_ms=$delay" --set "transport.emulate.rate_mbit=$rate" \
        --set "run.output_dir=$dir" >"$dir.log" 2>&1; then
    echo "run.sh: grid point $point failed; its output:" >&2
    tail -40 "$dir.log" >&2
    exit 1
  fi
  runs+=("$point" "$dir")
done
done
bench_finish

/usr/bin/python3 "$here/summarize.py" --steps "$steps" --interval "$interval" -- "${runs[@]}"

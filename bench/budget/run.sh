#!/usr/bin/env bash
# Budget benchmark: the budget model's predicted fragment sync time and compute utilization
# (tools/planner, `geoloco budget`) against what the trainer measures, over several emulated
# links (one-way delay and rate cap per site pair, `transport.emulate`) and outer schedules.
#
# The demo model (configs/demo.yaml: GPT 4 x 128, 0.84M params, int8 + error feedback + zstd)
# runs on 2 sites x 1 rank with evaluation and checkpoints off. Per schedule (F fragments,
# overlap tau) there is first one calibration run without emulation: it measures what a sync
# costs on this machine over a zero-latency, unlimited link (codec, outer step, loopback
# transfer, hash check) and the bytes per value the codec puts on the wire. Then every link
# runs with that schedule. summarize.py turns each point's inputs -- the link's nominal delay
# and rate, the calibration's local sync time and bytes per value, and the inner step time
# measured over the point's own first steps before any sync (as `outer.plan: auto` does) --
# into a budget YAML, asks `geoloco budget --json` for the prediction, and compares it with
# the point's measured syncs and utilization. No prediction uses a point's own sync times.
#
#   bench/budget/run.sh [--allow-load] [path/to/geoloco]            (default: build/geoloco)
#
# Its peer is a prediction, not a second program, so each point runs once; but measured sync
# and step times are load-sensitive, so the load gate of bench/lib.sh applies: it refuses to
# start above load average 1.0 unless --allow-load (then "loaded": true in the JSON).
#
# Prints ONE JSON document on stdout (progress on stderr); docs/planning.md ("Predicted vs
# measured") explains every figure.
#
# Environment: LINKS (space-separated delay_ms:rate_mbit; default below), SCHEDULES
# (space-separated F:tau; default "1:0 2:1 2:5"), STEPS (100), CAL_STEPS (100), INTERVAL (25),
# PORT_BASE (29900; every run takes two ports, 20 apart per run, inside 29900-30900),
# KEEP=1 keeps the runs (path on stderr).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
source "$root/bench/lib.sh"
bench_init "$@"
set -- "${bench_args[@]}"
geoloco="$(readlink -f "${1:-$root/build/geoloco}")"
[[ -x "$geoloco" ]] || { echo "run.sh: no geoloco binary at $geoloco (build it, or pass its path)" >&2; exit 2; }

# 5 ms one way at 1 Gbit/s (a regional pair), 25 ms at 1 Gbit/s (across a country), 50 ms at
# 200 Mbit/s (across an ocean), 100 ms at 100 Mbit/s (a poor intercontinental path).
read -r -a links <<<"${LINKS:-5:1000 25:1000 50:200 100:100}"
# Blocking; two fragments whose sync may take one step (about the sync time: the edge);
# two fragments with five steps (hidden).
read -r -a schedules <<<"${SCHEDULES:-1:0 2:1 2:5}"
steps="${STEPS:-100}"
cal_steps="${CAL_STEPS:-100}"
interval="${INTERVAL:-25}"
port_base="${PORT_BASE:-29900}"

out="$(mktemp -d /tmp/geoloco-bench-budget.XXXXXX)"
cleanup() { if [[ "${KEEP:-0}" == 1 ]]; then echo "run.sh: kept $out" >&2; else rm -rf "$out"; fi; }
trap cleanup EXIT

i=0
runone() {  # DIR STEPS F TAU DELAY RATE
  local dir="$1" n="$2" F="$3" tau="$4" delay="$5" rate="$6"
  local port=$((port_base + 20 * i))
  ((port + 10 <= 30900)) || { echo "run.sh: out of bench ports (PORT_BASE $port_base, run $i)" >&2; exit 2; }
  i=$((i + 1))
  echo "run.sh: F=$F tau=$tau delay=${delay}ms rate=${rate}Mbit/s steps=$n (port $port)" >&2
  cut -d' ' -f1-3 /proc/loadavg >"$dir.load_before"
  if ! "$geoloco" launch "$root/configs/demo.yaml" \
        --set "sites.0.ranks=1" --set "sites.1.ranks=1" \
        --set "sites.0.port=$port" --set "sites.1.port=$((port + 10))" \
        --set "train.steps=$n" --set "train.eval_every=0" --set "train.checkpoint_every=0" \
        --set "outer.interval=$interval" --set "outer.fragments=$F" --set "outer.overlap_steps=$tau" \
        --set "transport.emulate.delay_ms=$delay" --set "transport.emulate.rate_mbit=$rate" \
        --set "run.output_dir=$dir" >"$dir.log" 2>&1; then
    echo "run.sh: run $dir failed; its output:" >&2
    tail -40 "$dir.log" >&2
    exit 1
  fi
  cut -d' ' -f1-3 /proc/loadavg >"$dir.load_after"
}

load_before="$(cut -d' ' -f1-3 /proc/loadavg)"
args=()
for sched in "${schedules[@]}"; do
  IFS=: read -r F tau <<<"$sched"
  [[ -n "$tau" ]] || { echo "run.sh: schedule '$sched' is not F:tau" >&2; exit 2; }
  cal="$out/cal_F${F}_t${tau}"
  runone "$cal" "$cal_steps" "$F" "$tau" 0 0
  args+=(--calibration "$F:$tau" "$cal")
  for link in "${links[@]}"; do
    IFS=: read -r delay rate <<<"$link"
    [[ -n "$rate" ]] || { echo "run.sh: link '$link' is not delay_ms:rate_mbit" >&2; exit 2; }
    dir="$out/p_F${F}_t${tau}_d${delay}_r${rate}"
    runone "$dir" "$steps" "$F" "$tau" "$delay" "$rate"
    args+=(--point "$F:$tau:$delay:$rate" "$dir")
  done
done
load_after="$(cut -d' ' -f1-3 /proc/loadavg)"
bench_finish

/usr/bin/python3 "$here/summarize.py" --geoloco "$geoloco" --steps "$steps" --cal-steps "$cal_steps" \
  --interval "$interval" --nproc "$(nproc)" --load-before "$load_before" --load-after "$load_after" "${args[@]}"

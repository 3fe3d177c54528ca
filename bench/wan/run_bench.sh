#!/usr/bin/env bash
# bench/wan/run_bench.sh [--allow-load] [--out DIR] [--check] [SCENARIO...]
# For each WAN scenario (default: the 1 Gbit/s loss-free ones this 2-core machine can
# emulate), trains bench/wan/bench.yaml in two modes through tools/wan/run, alternating them
# BENCH_RUNS (5) times (bench/lib.sh: refuses to start above load average 1.0 unless
# --allow-load, then "loaded": true; every figure is the median over the runs, `runs` holds
# median, min, max and every value):
#   geoloco: the DiLoCo outer loop as configured (H = 10, int8 + error feedback);
#   ddp:     per-step data parallelism, emulated honestly with the same trainer: outer.interval=1,
#            fp32 pseudo-gradients, outer SGD with lr 1 and no momentum, i.e. every inner step the
#            sites exchange their full fp32 update through the same emulated link and apply the
#            average (what an all-reduce of the per-step update across sites would carry).
# Prints one JSON document (per scenario, medians: wall time, compute utilization = compute_s/wall_s,
# WAN bytes and validation loss for both, and the ratios ddp/geoloco), writes it to
# DIR/bench.json, and writes DIR/loss.svg (training loss of site 0 vs wall time, one panel
# per scenario, from the first round). --check runs the emulator's pre-run validation (slower; refused runs are
# reported as failed). Root. Every run is bounded (--timeout) and tears the emulator down.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
source "$root/bench/lib.sh"
bench_init "$@"
set -- "${bench_args[@]}"
out="$root/runs/bench-wan"
check=(--no-check)
scen=()
while (($#)); do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --check) check=(); shift ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    -*) echo "unknown option $1" >&2; exit 2 ;;
    *) scen+=("$1"); shift ;;
  esac
done
((${#scen[@]})) || scen=(metro-1g regional-1g continental-1g intercontinental-1g)
[[ $(id -u) -eq 0 ]] || { echo "bench/wan: needs root (network namespaces)" >&2; exit 1; }
export GEOLOCO_BIN="${GEOLOCO_BIN:-$root/build/geoloco}"
[[ -x "$GEOLOCO_BIN" ]] || { echo "bench/wan: no geoloco binary at $GEOLOCO_BIN" >&2; exit 1; }
mkdir -p "$out"
cfg="$here/bench.yaml"
ddp_sets=(--set outer.interval=1 --set outer.compression.codec=fp32 --set outer.compression.error_feedback=false
          --set outer.optimizer.kind=sgd --set outer.optimizer.lr=1.0 --set outer.optimizer.momentum=0)

# One training run through the emulator into $out/SCENARIO-MODE-ROUND; extra --set words go to the workers.
one_run() {
  local scenario="$1" mode="$2" round="$3" dir="$out/$1-$2-$3"; shift 3
  rm -rf "$dir"
  local rc=0
  "$root/tools/wan/run" --prefix glb "${check[@]}" --timeout 900 --output-dir "$dir" --result "$dir/wan-result.json" \
    "$root/configs/wan/$scenario.yaml" "$cfg" -- "$GEOLOCO_BIN" worker "$cfg" --site "{site}" --rank "{rank}" "{hosts}" \
    --set "run.output_dir=$dir" "$@" >"$out/$scenario-$mode-$round.log" 2>&1 || rc=$?
  echo "bench/wan: $scenario $mode round $round: status $rc" >&2
}

for s in "${scen[@]}"; do
  [[ -f "$root/configs/wan/$s.yaml" ]] || { echo "bench/wan: no scenario configs/wan/$s.yaml" >&2; exit 2; }
done
for ((r = 0; r < BENCH_RUNS; r++)); do
  for s in "${scen[@]}"; do
    one_run "$s" geoloco "$r"
    one_run "$s" ddp "$r" "${ddp_sets[@]}"
  done
done
bench_finish

# The table: one entry per scenario, geoloco's figures, the peer's and the ratios (medians over
# the rounds whose run completed; a mode with no completed run is null).
/usr/bin/python3 - "$out" "$GEOLOCO_BIN" "$BENCH_RUNS" "${scen[@]}" <<'PY' | tee "$out/bench.json"
import json, os, platform, statistics, sys
import benchlib
out, binary, runs, scen = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
KEYS = ("wall_s", "compute_s", "compute_utilization", "wan_bytes_sent_total", "val_loss", "outer_steps",
        "sync_seconds_mean")
def summary(s, mode, r):
    try:
        with open(f"{out}/{s}-{mode}-{r}/summary.json") as f:
            x = json.load(f)
    except (OSError, ValueError):
        return None
    x["compute_utilization"] = x["compute_s"] / x["wall_s"]
    return x
def fig(xs):
    if not xs:
        return None
    f = {k: statistics.median(x[k] for x in xs) for k in KEYS if all(x.get(k) is not None for x in xs)}
    f["completed_runs"] = len(xs)
    f["global_weights_hash"] = [x.get("global_weights_hash") for x in xs]
    f["runs"] = {k: benchlib.spread([x[k] for x in xs]) for k in ("wall_s", "compute_utilization", "sync_seconds_mean")
                 if all(x.get(k) is not None for x in xs)}
    return f
entries = []
for s in scen:
    g = [x for x in (summary(s, "geoloco", r) for r in range(runs)) if x]
    d = [x for x in (summary(s, "ddp", r) for r in range(runs)) if x]
    fg, fd = fig(g), fig(d)
    ratio = None
    if fg and fd:
        ratio = {"wall_ddp_over_geoloco": fd["wall_s"] / fg["wall_s"],
                 "wan_bytes_ddp_over_geoloco": fd["wan_bytes_sent_total"] / fg["wan_bytes_sent_total"]}
    entries.append({"scenario": s, "geoloco": fg, "ddp": fd, "ratio": ratio})
doc = {"format": "geoloco-bench-wan", "version": 2, "config": "bench/wan/bench.yaml",
       "peer": "per-step data parallelism (outer.interval=1, fp32, outer SGD lr 1)",
       "host": f"{platform.release()}, {os.cpu_count()} cores", "scenarios": entries}
doc.update(benchlib.load_record())
print(json.dumps(doc, indent=1))
PY

# Loss vs wall time: site 0's training loss from metrics.jsonl (elapsed_s, loss).
plot="$out/loss.gp"
{
  echo "set terminal svg size 1000,$((300 * ((${#scen[@]} + 1) / 2))) dynamic font 'sans,11'"
  echo "set output '$out/loss.svg'"
  echo "set multiplot layout $(((${#scen[@]} + 1) / 2)),2"
  echo "set xlabel 'wall time (s)'; set ylabel 'training loss (site 0)'; set key top right; set grid"
  for s in "${scen[@]}"; do
    for m in geoloco ddp; do
      jq -r 'select(.loss != null) | "\(.elapsed_s) \(.loss)"' "$out/$s-$m-0/metrics.jsonl" >"$out/$s-$m.dat" 2>/dev/null || : >"$out/$s-$m.dat"
    done
    echo "set title '$s'"
    echo "plot '$out/$s-geoloco.dat' with linespoints title 'geoloco (H=10, int8)', '$out/$s-ddp.dat' with linespoints title 'per-step DP (fp32)'"
  done
  echo "unset multiplot"
} >"$plot"
gnuplot "$plot" && echo "bench/wan: plot $out/loss.svg" >&2
"$here/to_markdown.sh" "$out/bench.json" >"$out/table.md" && echo "bench/wan: table $out/table.md" >&2

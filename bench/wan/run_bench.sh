#!/usr/bin/env bash
# bench/wan/run_bench.sh [--out DIR] [--check] [SCENARIO...]
# For each WAN scenario (default: the 1 Gbit/s loss-free ones this 2-core machine can
# emulate), trains bench/wan/bench.yaml twice through tools/wan/run:
#   geoloco: the DiLoCo outer loop as configured (H = 10, int8 + error feedback);
#   ddp:     per-step data parallelism, emulated honestly with the same trainer: outer.interval=1,
#            fp32 pseudo-gradients, outer SGD with lr 1 and no momentum, i.e. every inner step the
#            sites exchange their full fp32 update through the same emulated link and apply the
#            average (what an all-reduce of the per-step update across sites would carry).
# Prints one JSON document (per scenario: wall time, compute utilization = compute_s/wall_s,
# WAN bytes and validation loss for both, and the ratios ddp/geoloco), writes it to
# DIR/bench.json, and writes DIR/loss.svg (training loss of site 0 vs wall time, one panel
# per scenario). --check runs the emulator's pre-run validation (slower; refused runs are
# reported as failed). Root. Every run is bounded (--timeout) and tears the emulator down.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="$root/runs/bench-wan"
check=(--no-check)
scen=()
while (($#)); do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --check) check=(); shift ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
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

# One training run through the emulator; extra --set words go to the workers.
one_run() {
  local scenario="$1" mode="$2" dir="$out/$1-$2"; shift 2
  rm -rf "$dir"
  local rc=0
  "$root/tools/wan/run" --prefix glb "${check[@]}" --timeout 900 --output-dir "$dir" --result "$dir/wan-result.json" \
    "$root/configs/wan/$scenario.yaml" "$cfg" -- "$GEOLOCO_BIN" worker "$cfg" --site "{site}" --rank "{rank}" "{hosts}" \
    --set "run.output_dir=$dir" "$@" >"$out/$scenario-$mode.log" 2>&1 || rc=$?
  echo "bench/wan: $scenario $mode: status $rc" >&2
}

for s in "${scen[@]}"; do
  [[ -f "$root/configs/wan/$s.yaml" ]] || { echo "bench/wan: no scenario configs/wan/$s.yaml" >&2; exit 2; }
  one_run "$s" geoloco
  one_run "$s" ddp "${ddp_sets[@]}"
done

# The table: one entry per scenario, geoloco's figures, the peer's and the ratios.
entries='[]'
for s in "${scen[@]}"; do
  e="$(jq -n --arg s "$s" --slurpfile g <(cat "$out/$s-geoloco/summary.json" 2>/dev/null || echo null) \
           --slurpfile d <(cat "$out/$s-ddp/summary.json" 2>/dev/null || echo null) '
    def fig(x): if x == null then null else
      {wall_s: x.wall_s, compute_s: x.compute_s, compute_utilization: (x.compute_s / x.wall_s),
       wan_bytes_sent_total: x.wan_bytes_sent_total, val_loss: x.val_loss, outer_steps: x.outer_steps,
       sync_seconds_mean: x.sync_seconds_mean, global_weights_hash: x.global_weights_hash} end;
    {scenario: $s, geoloco: fig($g[0]), ddp: fig($d[0]),
     ratio: (if $g[0] == null or $d[0] == null then null else
       {wall_ddp_over_geoloco: ($d[0].wall_s / $g[0].wall_s),
        wan_bytes_ddp_over_geoloco: ($d[0].wan_bytes_sent_total / $g[0].wan_bytes_sent_total)} end)}')"
  entries="$(jq -c --argjson e "$e" '. + [$e]' <<<"$entries")"
done
jq -n --argjson e "$entries" --arg bin "$GEOLOCO_BIN" --arg host "$(uname -r), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)" \
  '{format: "geoloco-bench-wan", version: 1, config: "bench/wan/bench.yaml",
    peer: "per-step data parallelism (outer.interval=1, fp32, outer SGD lr 1)", host: $host, scenarios: $e}' \
  | tee "$out/bench.json"

# Loss vs wall time: site 0's training loss from metrics.jsonl (elapsed_s, loss).
plot="$out/loss.gp"
{
  echo "set terminal svg size 1000,$((300 * ((${#scen[@]} + 1) / 2))) dynamic font 'sans,11'"
  echo "set output '$out/loss.svg'"
  echo "set multiplot layout $(((${#scen[@]} + 1) / 2)),2"
  echo "set xlabel 'wall time (s)'; set ylabel 'training loss (site 0)'; set key top right; set grid"
  for s in "${scen[@]}"; do
    for m in geoloco ddp; do
      jq -r 'select(.loss != null) | "\(.elapsed_s) \(.loss)"' "$out/$s-$m/metrics.jsonl" >"$out/$s-$m.dat" 2>/dev/null || : >"$out/$s-$m.dat"
    done
    echo "set title '$s'"
    echo "plot '$out/$s-geoloco.dat' with linespoints title 'geoloco (H=10, int8)', '$out/$s-ddp.dat' with linespoints title 'per-step DP (fp32)'"
  done
  echo "unset multiplot"
} >"$plot"
gnuplot "$plot" && echo "bench/wan: plot $out/loss.svg" >&2
"$here/to_markdown.sh" "$out/bench.json" >"$out/table.md" && echo "bench/wan: table $out/table.md" >&2

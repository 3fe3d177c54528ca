#!/usr/bin/env bash
# Rehearsal at real size (train.rehearsal, docs/rehearsal.md): outer.plan: auto's predicted
# compute utilization and fragment sync time against what the real outer loop measured, per
# emulated WAN scenario. Root (tools/wan: network namespaces).
#
# Each run: configs/rehearse.yaml's 254M model on 2 sites x 2 fsdp ranks, stand-in steps of
# 0.5 s, int8 + zstd 3 base compression, outer.plan: auto (target utilization 0.8, H >= 10, so
# a period is short enough for several syncs in 100 steps), through tools/wan/run SCENARIO.
# Per run: the plan's prediction (rehearsal.predicted) and the measurement: the mean fragment
# sync of the rounds after the first (the first pays its buffers' page faults: reported
# apart), and paris' compute utilization over the whole periods after the first sync
# (metrics lines; the run's last, partial period with its final blocking sync left out). The JSON gives medians (min, max) over the runs per scenario, the ratios measured /
# predicted, and the worst ratio. The peer is the prediction, not a run: like bench/budget,
# the load gate applies and the load is recorded; scenarios alternate within each run index.
#
#   bench/rehearsal/run.sh [--allow-load] [path/to/geoloco]
#
# Environment: bench/lib.sh's (BENCH_RUNS >= 5), SCENARIOS ("metro-1g continental-1g
# intercontinental-1g"), STEPS (100), KEEP=1. Prints ONE JSON document on stdout.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
source "$root/bench/lib.sh"
bench_init "$@"
set -- "${bench_args[@]}"
geoloco="$(readlink -f "${1:-$root/build/geoloco}")"
[[ -x "$geoloco" ]] || { echo "run.sh: no geoloco binary at $geoloco" >&2; exit 2; }
[[ $(id -u) == 0 ]] || { echo "run.sh: needs root (tools/wan creates network namespaces)" >&2; exit 2; }
read -r -a scenarios <<<"${SCENARIOS:-metro-1g continental-1g intercontinental-1g}"
steps="${STEPS:-100}"

out="$(mktemp -d /tmp/geoloco-bench-rehearsal.XXXXXX)"
cleanup() { if [[ "${KEEP:-0}" == 1 ]]; then echo "run.sh: kept $out" >&2; else rm -rf "$out"; fi; }
trap cleanup EXIT
sed -e "s#psk_file: demo.psk#psk_file: $root/configs/demo.psk#" -e "s#  steps: 200#  steps: $steps#" \
  -e 's#  overlap_steps: 5#  plan: auto\n  target_utilization: 0.8\n  plan_h_min: 10#' -e 's#  fragments: 4##' \
  "$root/configs/rehearse.yaml" >"$out/rehearse-auto.yaml"

for ((r = 1; r <= BENCH_RUNS; ++r)); do
  for sc in "${scenarios[@]}"; do
    echo "run.sh: $sc run $r" >&2
    GEOLOCO_BIN="$geoloco" "$root/tools/wan/run" --timeout 900 --output-dir "$out/$sc-$r" \
      "$root/configs/wan/$sc.yaml" "$out/rehearse-auto.yaml" >"$out/$sc-$r.log" 2>&1 ||
      { echo "run.sh: $sc run $r failed:" >&2; tail -30 "$out/$sc-$r.log" >&2; exit 1; }
    rm -rf "$out/$sc-$r/checkpoints"  # about 10 GB per run at 254M; the summary and metrics stay
  done
done
bench_finish
python3 "$here/summarize.py" "$out" "${scenarios[@]}"

#!/usr/bin/env bash
# Intra-site strategy benchmark on CPU: ddp, zero1, zero2, fsdp with 2 and 4 ranks of one site
# (bench.yaml: GPT 4 layers, d 128, 0.84M params, 40 steps, synthetic data, 1 thread per
# rank). Each (strategy, ranks) runs `geoloco launch bench.yaml --set ...`; summarize.py reads
# the runs' summary.json files and prints ONE JSON document to stdout: step time, bytes each
# rank sent per step over the site's collectives, memory per rank, and every figure's ratio to
# ddp with the same rank count (the named peer).
#
#   bench/strategies/run.sh [--allow-load] [path/to/geoloco]        (default: build/geoloco)
#
# The discipline of bench/lib.sh: refuses to start above load average 1.0 unless --allow-load
# (then "loaded": true); for each rank count, BENCH_RUNS (5) rounds of every strategy in turn
# (the peer ddp alternating with the others); step times are medians with min and max.
# Environment: STRATEGIES ("ddp zero1 zero2 fsdp"), RANKS ("2 4"), STEPS (40), BENCH_RUNS (5),
# PORT_BASE (31400; run i uses PORT_BASE + 10 i .. + 10 i + ranks),
# KEEP=1 keeps the runs' output directory (path printed on stderr).
# Progress goes to stderr; stdout is only the JSON document. Measured figures: README.md.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
source "$root/bench/lib.sh"
bench_init "$@"
set -- "${bench_args[@]}"
geoloco="$(readlink -f "${1:-$root/build/geoloco}")"
[[ -x "$geoloco" ]] || { echo "run.sh: no geoloco binary at $geoloco (build it, or pass its path)" >&2; exit 2; }

strategies=(${STRATEGIES:-ddp zero1 zero2 fsdp})
ranks_list=(${RANKS:-2 4})
steps="${STEPS:-40}"
port_base="${PORT_BASE:-31400}"

out="$(mktemp -d /tmp/geoloco-bench-strategies.XXXXXX)"
cleanup() { if [[ "${KEEP:-0}" == 1 ]]; then echo "run.sh: kept $out" >&2; else rm -rf "$out"; fi; }
trap cleanup EXIT

i=0
runs=()
for n in "${ranks_list[@]}"; do
  for ((rep = 0; rep < BENCH_RUNS; rep++)); do
    for s in "${strategies[@]}"; do
      dir="$out/${s}_r${n}_${rep}"
      port=$((port_base + 10 * i))
      i=$((i + 1))
      echo "run.sh: $s, $n ranks, repeat $rep (port $port)" >&2
      if ! "$geoloco" launch "$here/bench.yaml" \
            --set "site.strategy=$s" --set "sites.0.ranks=$n" --set "sites.0.port=$port" \
            --set "train.steps=$steps" --set "run.output_dir=$dir" >"$dir.log" 2>&1; then
        echo "run.sh: $s with $n ranks failed; its output:" >&2
        cat "$dir.log" >&2
        exit 1
      fi
      runs+=("$s" "$n" "$rep" "$dir/summary.json")
    done
  done
done
bench_finish

/usr/bin/python3 "$here/summarize.py" --steps "$steps" -- "${runs[@]}"

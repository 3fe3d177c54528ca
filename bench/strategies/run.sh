#!/usr/bin/env bash
# Intra-site strategy benchmark on CPU: ddp, zero1, zero2, fsdp (and hybrid) with 2 and 4 ranks
# of one site (bench.yaml: GPT 4 layers, d 128, 0.84M params, 40 steps, synthetic data, 1
# thread per rank). Each (strategy, ranks) runs `geoloco launch bench.yaml --set ...`;
# summarize.py reads the runs' summary.json files and prints ONE JSON document to stdout: step
# time, bytes each rank sent per step over the site's collectives, memory per rank, and every
# figure's ratio to ddp with the same rank count (the named peer).
#
# A strategy token `hybridG` runs site.strategy: hybrid with group_size G (docs/strategies.md).
#
# NODES=2 (root): the site's ranks on two nodes -- network namespaces joined by one veth link
# rate-limited to LINK_MBIT (1000) each way (tc tbf) -- the first half of the ranks on
# node 0, the rest on node 1, each node started by its own `geoloco launch --site site --node I`
# inside its namespace; ranks of one node talk over that node's own address, unshaped (an
# emulated pair of NVLink islands behind a slower link). The JSON then also gives the bytes that
# crossed the link per step (the veth counters, both directions): what the strategy choice is
# about. Namespaces glbs-n0/glbs-n1 and their link are removed on exit.
#
#   bench/strategies/run.sh [--allow-load] [path/to/geoloco]        (default: build/geoloco)
#   NODES=2 RANKS=4 STRATEGIES="ddp fsdp hybrid2" bench/strategies/run.sh
#
# The discipline of bench/lib.sh: refuses to start above load average 1.0 unless --allow-load
# (then "loaded": true); for each rank count, BENCH_RUNS (5) rounds of every strategy in turn
# (the peer ddp alternating with the others); step times are medians with min and max.
# Environment: STRATEGIES ("ddp zero1 zero2 fsdp"), RANKS ("2 4"), STEPS (40), BENCH_RUNS (5),
# PORT_BASE (31400; run i uses PORT_BASE + 10 i .. + 10 i + ranks), NODES (1), LINK_MBIT,
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
nodes="${NODES:-1}"
link_mbit="${LINK_MBIT:-1000}"
[[ "$nodes" == 1 || "$nodes" == 2 ]] || { echo "run.sh: NODES=$nodes: expected 1 or 2" >&2; exit 2; }

out="$(mktemp -d /tmp/geoloco-bench-strategies.XXXXXX)"
ns=(glbs-n0 glbs-n1)
addr=(198.18.250.1 198.18.250.2)
teardown() {
  if [[ "$nodes" == 2 ]]; then
    for n in "${ns[@]}"; do ip netns pids "$n" 2>/dev/null | xargs -r kill -9 2>/dev/null || true; done
    for n in "${ns[@]}"; do ip netns del "$n" 2>/dev/null || true; done
  fi
}
cleanup() {
  teardown
  if [[ "${KEEP:-0}" == 1 ]]; then echo "run.sh: kept $out" >&2; else rm -rf "$out"; fi
}
trap cleanup EXIT

config="$here/bench.yaml"
if [[ "$nodes" == 2 ]]; then
  [[ "$(id -u)" == 0 ]] || { echo "run.sh: NODES=2 needs root (network namespaces, tc)" >&2; exit 77; }
  teardown
  for i in 0 1; do ip netns add "${ns[$i]}"; ip -n "${ns[$i]}" link set lo up; done
  ip link add glbs-v0 netns "${ns[0]}" type veth peer name glbs-v1 netns "${ns[1]}"
  for i in 0 1; do
    ip -n "${ns[$i]}" addr add "${addr[$i]}/24" dev "glbs-v$i"
    ip -n "${ns[$i]}" link set "glbs-v$i" up
    tc -n "${ns[$i]}" qdisc add dev "glbs-v$i" root tbf rate "${link_mbit}mbit" burst 256kb latency 100ms
  done
  # The base config without `host` (the ranks' addresses come from sites.0.hosts per run).
  sed '/^sites:/,$d' "$here/bench.yaml" >"$out/bench.yaml"
  echo "sites:" >>"$out/bench.yaml"
  echo "  - {name: site, ranks: 2, port: 31400}" >>"$out/bench.yaml"
  config="$out/bench.yaml"
fi
link_bytes() {  # bytes sent by both ends of the link so far
  local t=0 i
  for i in 0 1; do t=$((t + $(ip netns exec "${ns[$i]}" cat "/sys/class/net/glbs-v$i/statistics/tx_bytes"))); done
  echo "$t"
}

i=0
runs=()
for n in "${ranks_list[@]}"; do
  for ((rep = 0; rep < BENCH_RUNS; rep++)); do
    for s in "${strategies[@]}"; do
      dir="$out/${s}_r${n}_${rep}"
      port=$((port_base + 10 * i))
      i=$((i + 1))
      sets=(--set "sites.0.ranks=$n" --set "sites.0.port=$port" --set "train.steps=$steps" --set "run.output_dir=$dir")
      if [[ "$s" =~ ^hybrid([0-9]+)$ ]]; then
        sets+=(--set "site.strategy=hybrid" --set "site.group_size=${BASH_REMATCH[1]}")
      else
        sets+=(--set "site.strategy=$s")
      fi
      echo "run.sh: $s, $n ranks, repeat $rep (port $port)" >&2
      crossed=0
      if [[ "$nodes" == 1 ]]; then
        if ! "$geoloco" launch "$config" "${sets[@]}" >"$dir.log" 2>&1; then
          echo "run.sh: $s with $n ranks failed; its output:" >&2
          cat "$dir.log" >&2
          exit 1
        fi
      else
        hosts=""
        for ((r = 0; r < n; r++)); do hosts+="${hosts:+,}${addr[$((r * 2 / n))]}"; done
        sets+=(--set "sites.0.hosts=[$hosts]")
        before="$(link_bytes)"
        ip netns exec "${ns[1]}" "$geoloco" launch "$config" "${sets[@]}" --site site --node 1 >"$dir.n1.log" 2>&1 &
        pid1=$!
        ok=1
        ip netns exec "${ns[0]}" "$geoloco" launch "$config" "${sets[@]}" --site site --node 0 >"$dir.log" 2>&1 || ok=0
        wait "$pid1" || ok=0
        if [[ "$ok" != 1 ]]; then
          echo "run.sh: $s with $n ranks on 2 nodes failed; its output:" >&2
          cat "$dir.log" "$dir.n1.log" >&2
          exit 1
        fi
        crossed=$(($(link_bytes) - before))
      fi
      runs+=("$s" "$n" "$rep" "$dir/summary.json" "$crossed")
    done
  done
done
bench_finish

/usr/bin/python3 "$here/summarize.py" --steps "$steps" --nodes "$nodes" --link "${link_mbit} Mbit/s each way" -- "${runs[@]}"

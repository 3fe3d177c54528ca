#!/usr/bin/env bash
# Sites of different speeds (outer.pace, docs/shapes.md): what a site at half speed costs the
# fast one, and the run's loss.
#
# Two sites of one rank on this machine (UCX loopback), the model of bench/quality (2 layers,
# width 128, context 64, license texts), 16 sequences per step per site, H = 20, 240 steps,
# one thread per rank. Three configurations, alternated within each run r (seed r):
#   equal        both sites at full speed, pace: steps (the reference)
#   slow_steps   lyon at half speed (sites[1].slowdown: 2), pace: steps: the peer, what a
#                slower site did before pace: time (the fast site waits at every sync)
#   slow_time    lyon at half speed, pace: time (lyon trains fewer steps per period)
# Per run: the fast site's (paris) compute utilization in steady state (the periods of outer
# steps 3 to 11: the first two include start-up and the first pace decision), lyon's share of
# steps trained, the run's wall time and its final validation loss (whole held-out split).
# The JSON gives medians (min, max) of the times over BENCH_RUNS runs and the losses' mean
# and spread over the seeds, slow_time against slow_steps (the peer) and against equal.
#
#   bench/pace/run.sh [--allow-load] [path/to/geoloco]     (default: build/geoloco)
#
# Environment: bench/lib.sh's (BENCH_RUNS >= 5, load gate), PORT_BASE (37200), KEEP=1.
# Prints ONE JSON document on stdout (bench/pace/results/pace.json keeps the quoted one).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
source "$root/bench/lib.sh"
bench_init "$@"
set -- "${bench_args[@]}"
geoloco="$(readlink -f "${1:-$root/build/geoloco}")"
[[ -x "$geoloco" ]] || { echo "run.sh: no geoloco binary at $geoloco (build it, or pass its path)" >&2; exit 2; }
port="${PORT_BASE:-37200}"

out="$(mktemp -d /tmp/geoloco-bench-pace.XXXXXX)"
cleanup() { if [[ "${KEEP:-0}" == 1 ]]; then echo "run.sh: kept $out" >&2; else rm -rf "$out"; fi; }
trap cleanup EXIT
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$out/k.psk"
cat >"$out/pace.yaml" <<YAML
run: {name: pace, seed: 1, output_dir: $out/run}
model: {n_layer: 2, n_head: 4, n_embd: 128, block_size: 64, vocab_size: 256}
data:
  train: {kind: text, path: /usr/share/common-licenses}
  val_fraction: 0.1
train:
  steps: 240
  micro_batch: 16
  threads: 1
  optimizer: {kind: adamw, lr: 1.0e-3}
  schedule: {kind: cosine, warmup_steps: 20, min_lr: 1.0e-4}
  log_every: 20
  eval_every: 0
  eval_batches: 100000
sites:
  - {name: paris, port: $port}
  - {name: lyon, port: $((port + 10))}
outer:
  interval: 20
  weighting: tokens
  optimizer: {kind: nesterov, lr: 0.7, momentum: 0.9}
  compression: {codec: int8, block: 128, zstd_level: 1}
transport: {psk_file: k.psk, timeout_s: 120}
YAML

# one NAME SEED [--set k=v]...
one() {
  local name="$1" seed="$2"
  shift 2
  local dir="$out/$name-$seed"
  echo "run.sh: $name seed $seed" >&2
  "$geoloco" launch "$out/pace.yaml" --plain --set run.seed="$seed" --set run.output_dir="$dir" "$@" \
    >"$dir.log" 2>&1 || { echo "run.sh: $name seed $seed failed:" >&2; tail -30 "$dir.log" >&2; exit 1; }
}

for ((r = 1; r <= BENCH_RUNS; ++r)); do
  one equal "$r"
  one slow_steps "$r" --set sites.1.slowdown=2
  one slow_time "$r" --set sites.1.slowdown=2 --set outer.pace=time
done
bench_finish
python3 "$here/summarize.py" "$out"

#!/usr/bin/env bash
# The owner exchange (outer.exchange: owner, docs/shapes.md "Many sites") against all-to-all on
# 2, 4 and 8 sites: bytes per site per round, the sync time over an emulated link, and the final
# loss.
#
# S sites of one rank on this machine (UCX loopback, one thread per rank), the model of
# bench/pace (2 layers, width 128, context 64, license texts), 8 sequences per step per site,
# H = 20, 120 steps (6 rounds, the last at step 120), int4 + error feedback (the lossy case:
# the owner quantizes the average once more), blocking syncs. Every site pair's link is the
# sender-side emulation hook (transport.emulate: 10 ms one way, RATE_MBIT per pair, default 50):
# a full mesh of dedicated links, where all-to-all sends a whole shard over each and the owner
# exchange 2/S of one. (A site whose one uplink all peers share is the budget model's case:
# geoloco budget --pattern owner.) Alternated within each run r (seed r): all_to_all, owner.
# Per run: each site's bytes sent per round (transport counters / rounds), the sites' mean sync
# time (summary sync_seconds_mean), the final validation loss (held-out split).
#
#   bench/exchange/run.sh [--allow-load] [path/to/geoloco]     (default: build/geoloco)
#
# Environment: bench/lib.sh's (BENCH_RUNS >= 5, load gate), SITES ("2 4 8"), RATE_MBIT (50),
# PORT_BASE (37400), KEEP=1. Prints ONE JSON document on stdout (results/exchange.json keeps the
# quoted one).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
source "$root/bench/lib.sh"
bench_init "$@"
set -- "${bench_args[@]}"
geoloco="$(readlink -f "${1:-$root/build/geoloco}")"
[[ -x "$geoloco" ]] || { echo "run.sh: no geoloco binary at $geoloco (build it, or pass its path)" >&2; exit 2; }
port="${PORT_BASE:-37400}"
rate="${RATE_MBIT:-50}"
sites_list="${SITES:-2 4 8}"

out="$(mktemp -d /tmp/geoloco-bench-exchange.XXXXXX)"
cleanup() { if [[ "${KEEP:-0}" == 1 ]]; then echo "run.sh: kept $out" >&2; else rm -rf "$out"; fi; }
trap cleanup EXIT
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$out/k.psk"
names=(paris lyon frankfurt milan madrid vienna zurich prague)
for S in $sites_list; do
  {
    cat <<YAML
run: {name: exchange, seed: 1, output_dir: $out/run}
model: {n_layer: 2, n_head: 4, n_embd: 128, block_size: 64, vocab_size: 256}
data:
  train: {kind: text, path: /usr/share/common-licenses}
  val_fraction: 0.1
train:
  steps: 120
  micro_batch: 8
  threads: 1
  optimizer: {kind: adamw, lr: 1.0e-3}
  schedule: {kind: cosine, warmup_steps: 20, min_lr: 1.0e-4}
  log_every: 20
  eval_every: 0
  eval_batches: 100000
outer:
  interval: 20
  min_sites: $S
  optimizer: {kind: nesterov, lr: 0.7, momentum: 0.9}
  compression: {codec: int4, block: 128, error_feedback: true, zstd_level: 1}
transport: {psk_file: k.psk, timeout_s: 120, emulate: {delay_ms: 10, rate_mbit: $rate}}
sites:
YAML
    for ((i = 0; i < S; ++i)); do echo "  - {name: ${names[i]}, port: $((port + 10 * i))}"; done
  } >"$out/s$S.yaml"
done

# one SITES EXCHANGE SEED
one() {
  local S="$1" ex="$2" seed="$3"
  local dir="$out/s$S-$ex-$seed"
  echo "run.sh: $S sites, $ex, seed $seed" >&2
  "$geoloco" launch "$out/s$S.yaml" --plain --set run.seed="$seed" --set run.output_dir="$dir" \
    --set outer.exchange="$ex" >"$dir.log" 2>&1 ||
    { echo "run.sh: $S sites $ex seed $seed failed:" >&2; tail -30 "$dir.log" >&2; exit 1; }
}

for ((r = 1; r <= BENCH_RUNS; ++r)); do
  for S in $sites_list; do
    one "$S" all_to_all "$r"
    one "$S" owner "$r"
  done
done
bench_finish
python3 "$here/summarize.py" "$out" "$rate"

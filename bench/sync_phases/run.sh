#!/usr/bin/env bash
# Where a blocking sync's time goes at real size, phase by phase, against the transport's raw
# figure for the same bytes in the same run (issue "the real outer loop at real model size").
#
# Each geoloco run: 2 sites x 1 rank on loopback (UCX, its default transports), a rehearsal
# (train.rehearsal: stand-in inner steps of 0.2 s, the real outer loop at the model's size),
# blocking syncs every 5 steps, 20 steps; paris/0's trace gives each sync's spans (compress,
# send/receive, decode + average, outer step, merge, membership, hash check) and rounds.jsonl
# its sync time; the first sync (first touch of its buffers) is left out, the median of the
# others kept. The peer: bench_transport --exchange (both sites send at once) of the bytes
# one envelope carries, run between the geoloco runs: what the network part could take.
# Sizes: 26M, 97M and 254M parameters; codecs: fp32 and int4 + error feedback + zstd 3.
#
#   bench/sync_phases/run.sh [--allow-load] [build_dir]
#
# Environment: bench/lib.sh's (BENCH_RUNS >= 5), SIZES ("26m 97m 254m"), CODECS ("fp32 int4"),
# KEEP=1. Prints ONE JSON document on stdout.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
source "$root/bench/lib.sh"
bench_init "$@"
set -- "${bench_args[@]}"
build="$(readlink -f "${1:-$root/build}")"
geoloco="$build/geoloco"
transport_bench="$build/bench/transport/bench_transport"
[[ -x "$geoloco" && -x "$transport_bench" ]] || { echo "run.sh: no geoloco or bench_transport under $build" >&2; exit 2; }
read -r -a sizes <<<"${SIZES:-26m 97m 254m}"
read -r -a codecs <<<"${CODECS:-fp32 int4}"

out="$(mktemp -d /tmp/geoloco-bench-sync-phases.XXXXXX)"
cleanup() { if [[ "${KEEP:-0}" == 1 ]]; then echo "run.sh: kept $out" >&2; else rm -rf "$out"; fi; }
trap cleanup EXIT
# Copies, so a rebuild during the run changes nothing.
cp "$geoloco" "$out/geoloco"
cp "$transport_bench" "$out/bench_transport"

model() {  # size -> the model line
  case "$1" in
    26m) echo "{n_layer: 7, n_head: 8, n_embd: 512, block_size: 256, vocab_size: 8192}" ;;
    97m) echo "{n_layer: 7, n_head: 16, n_embd: 1024, block_size: 256, vocab_size: 8192}" ;;
    254m) echo "{n_layer: 16, n_head: 16, n_embd: 1024, block_size: 1024, vocab_size: 50257}" ;;
    *) echo "run.sh: unknown size $1 (26m 97m 254m)" >&2; exit 2 ;;
  esac
}
compression() {
  case "$1" in
    fp32) echo "{codec: fp32}" ;;
    int4) echo "{codec: int4, block: 128, error_feedback: true, zstd_level: 3}" ;;
    *) echo "run.sh: unknown codec $1 (fp32 int4)" >&2; exit 2 ;;
  esac
}
port=29700
for size in "${sizes[@]}"; do
  for codec in "${codecs[@]}"; do
    port=$((port + 40))
    cat >"$out/$size-$codec.yaml" <<YAML
run: {name: sync-phases, seed: 1, output_dir: OUT}
model: $(model "$size")
data:
  train: {kind: synthetic, vocab: 8192, tokens: 1048576}
train:
  steps: 20
  log_every: 5
  rehearsal: {step_seconds: 0.2, drift: 1.0e-5}
sites:
  - {name: paris, ranks: 1, port: $port}
  - {name: lyon, ranks: 1, port: $((port + 10))}
outer:
  interval: 5
  compression: $(compression "$codec")
transport: {psk_file: $root/configs/demo.psk, timeout_s: 300}
YAML
  done
done

for ((r = 1; r <= BENCH_RUNS; ++r)); do
  for size in "${sizes[@]}"; do
    for codec in "${codecs[@]}"; do
      dir="$out/$size-$codec-$r"
      echo "run.sh: $size $codec run $r" >&2
      sed "s#output_dir: OUT#output_dir: $dir#" "$out/$size-$codec.yaml" >"$out/run.yaml"
      "$out/geoloco" launch "$out/run.yaml" >"$dir.log" 2>&1 ||
        { echo "run.sh: $size $codec run $r failed:" >&2; tail -20 "$dir.log" >&2; exit 1; }
      rm -rf "$dir/checkpoints"
      # The peer, right after: the same envelope size both ways at once on the same path.
      mib="$(python3 -c "import json,sys; j=[json.loads(l) for l in open('$dir/sites/paris/rounds.r0.jsonl')]; print(max(1, round(j[-1]['bytes_per_peer'] / 2**20)))")"
      "$out/bench_transport" --exchange --sizes-mib "$mib" --reps 3 \
        >"$dir.transport.json" 2>"$dir.transport.log" ||
        { echo "run.sh: bench_transport failed:" >&2; tail -20 "$dir.transport.log" >&2; exit 1; }
    done
  done
done
bench_finish
python3 "$here/summarize.py" "$out" "${#sizes[@]}" "${sizes[@]}" "${codecs[@]}"

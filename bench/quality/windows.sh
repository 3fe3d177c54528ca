#!/usr/bin/env bash
# bench/quality/windows.sh: aligned vs random training windows (data.windows), synchronous
# (one site) and DiLoCo (4 sites x 1 rank, H = 50), 3 seeds each, on the issue's small
# setting: 2 layers, width 128, 4 heads, context 64, bytes of the Debian license texts (last
# 10% held out), 1000 inner steps of 32 sequences in all, AdamW 1e-3 (warmup 50, cosine to
# 1e-4), Nesterov 0.7/0.9, fp32 pseudo-gradients. Scores every run's final validation loss on
# the whole held-out split (the run's final evaluation) and writes results/windows.json (mean, min, max per row).
#   bench/quality/windows.sh [--seeds "1 2 3"] [--out DIR]
# Training loss values do not depend on machine load (the runs are deterministic), so no load
# gate; each run takes about a minute (sync) or two (DiLoCo) on 2 cores.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
bin="${GEOLOCO_BIN:-$root/build/geoloco}"
seeds="1 2 3"
out="$(mktemp -d /tmp/geoloco-windows.XXXXXX)"
while (($#)); do
  case "$1" in
    --seeds) seeds="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) echo "usage: $0 [--seeds \"1 2 3\"] [--out DIR]" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$out/k.psk"
cat >"$out/base.yaml" <<YAML
run: {name: windows, seed: 1, output_dir: $out/run}
model: {n_layer: 2, n_head: 4, n_embd: 128, block_size: 64, vocab_size: 256}
data:
  train: {kind: text, path: /usr/share/common-licenses}
  val_fraction: 0.1
train:
  steps: 1000
  micro_batch: 32
  optimizer: {kind: adamw, lr: 1.0e-3}
  schedule: {kind: cosine, warmup_steps: 50, min_lr: 1.0e-4}
  log_every: 100
  eval_every: 0
  eval_batches: 100000
YAML
port=$((38000 + RANDOM % 900 * 10))  # four sites: port .. port + 31
cat >"$out/diloco.yaml" <<YAML
run: {name: windows, seed: 1, output_dir: $out/run}
model: {n_layer: 2, n_head: 4, n_embd: 128, block_size: 64, vocab_size: 256}
data:
  train: {kind: text, path: /usr/share/common-licenses}
  val_fraction: 0.1
train:
  steps: 1000
  micro_batch: 8
  optimizer: {kind: adamw, lr: 1.0e-3}
  schedule: {kind: cosine, warmup_steps: 50, min_lr: 1.0e-4}
  log_every: 100
  eval_every: 0
  eval_batches: 100000
sites:
  - {name: s0, port: $port}
  - {name: s1, port: $((port + 10))}
  - {name: s2, port: $((port + 20))}
  - {name: s3, port: $((port + 30))}
outer:
  interval: 50
  optimizer: {kind: nesterov, lr: 0.7, momentum: 0.9}
  compression: {codec: fp32}
transport: {psk_file: k.psk, timeout_s: 120}
YAML
echo '[]' >"$out/runs.json"
for seed in $seeds; do
  for kind in sync diloco; do
    for windows in aligned random; do
      cfg="$out/base.yaml"; cmd=train
      [[ $kind == diloco ]] && { cfg="$out/diloco.yaml"; cmd=launch; }
      dir="$out/$kind-$windows-$seed"
      "$bin" "$cmd" "$cfg" --set run.seed="$seed" --set data.windows="$windows" --set run.output_dir="$dir" \
        $([[ $cmd == launch ]] && echo --plain) >"$dir.log" 2>&1 || { tail -20 "$dir.log" >&2; exit 1; }
      # The final validation loss over the whole held-out split (eval_batches covers it), of
      # the model every site ends with (the last step's blocking sync: bit-identical).
      val="$(jq -r '.val_loss' "$dir/summary.json")"
      echo "$kind $windows seed $seed: val $val"
      jq --arg k "$kind" --arg w "$windows" --argjson s "$seed" --argjson v "$val" \
        '. + [{kind: $k, windows: $w, seed: $s, val_loss: $v}]' "$out/runs.json" >"$out/runs.tmp" &&
        mv "$out/runs.tmp" "$out/runs.json"
    done
  done
done
mkdir -p "$root/bench/quality/results"
jq '{format: "geoloco-bench-windows", version: 1,
     setting: "2 layers, d 128, 4 heads, T 64, bytes, 1000 steps x 32 sequences, AdamW 1e-3; DiLoCo 4 sites x 1 rank, H 50, Nesterov 0.7/0.9, fp32",
     runs: .,
     rows: (group_by(.kind + " " + .windows) | map({kind: .[0].kind, windows: .[0].windows,
            seeds: [.[].seed], mean: ([.[].val_loss] | add / length),
            min: ([.[].val_loss] | min), max: ([.[].val_loss] | max)}))}' "$out/runs.json" \
  >"$root/bench/quality/results/windows.json"
jq -c '.rows[]' "$root/bench/quality/results/windows.json"

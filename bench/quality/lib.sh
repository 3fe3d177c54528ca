# bench/quality/lib.sh: the small quality grid's runner (sourced by the bench/quality scripts).
# The setting is the quality issue's: 2 layers, width 128, 4 heads, context 64, bytes of the
# Debian license texts (last 10% held out), 1000 inner steps of 32 sequences in all, AdamW 1e-3
# (warmup 50, cosine to 1e-4); DiLoCo rows: 4 sites x 1 rank of 8 sequences, H = 50. The final
# validation loss covers the whole held-out split (eval_batches covers it), of the model every
# site ends with (the last step's blocking sync: bit-identical). Loss values do not depend on
# machine load (the runs are deterministic), so there is no load gate.
#
#   quality_args "$@"             --seeds "1 2 3" (default) and --out DIR (default a temp dir):
#                                 sets quality_seeds and calls quality_init
#   quality_init OUT_DIR          writes OUT/sync.yaml, OUT/diloco.yaml, OUT/k.psk, OUT/runs.json
#   quality_row NAME KIND SEED [--set k=v]...   KIND: sync | diloco; appends {row, kind, seed, val_loss}
#   quality_summary OUT_DIR RESULT_JSON SETTING_TEXT   rows: mean, min, max over seeds

quality_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
quality_bin="${GEOLOCO_BIN:-$quality_root/build/geoloco}"

quality_args() {
  quality_seeds="1 2 3"
  local out
  out="$(mktemp -d /tmp/geoloco-quality.XXXXXX)"
  while (($#)); do
    case "$1" in
      --seeds) quality_seeds="$2"; shift 2 ;;
      --out) out="$2"; shift 2 ;;
      *) echo "usage: $0 [--seeds \"1 2 3\"] [--out DIR]" >&2; exit 2 ;;
    esac
  done
  quality_init "$out"
}

quality_init() {
  quality_out="$1"
  mkdir -p "$quality_out"
  head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$quality_out/k.psk"
  local common port
  common="model: {n_layer: 2, n_head: 4, n_embd: 128, block_size: 64, vocab_size: 256}
data:
  train: {kind: text, path: /usr/share/common-licenses}
  val_fraction: 0.1"
  local train="  steps: 1000
  optimizer: {kind: adamw, lr: 1.0e-3}
  schedule: {kind: cosine, warmup_steps: 50, min_lr: 1.0e-4}
  log_every: 100
  eval_every: 0
  eval_batches: 100000"
  printf 'run: {name: quality, seed: 1, output_dir: %s/run}\n%s\ntrain:\n  micro_batch: 32\n%s\n' \
    "$quality_out" "$common" "$train" >"$quality_out/sync.yaml"
  port=$((38000 + RANDOM % 900 * 10))  # four sites: port .. port + 31
  printf 'run: {name: quality, seed: 1, output_dir: %s/run}\n%s\ntrain:\n  micro_batch: 8\n%s\n' \
    "$quality_out" "$common" "$train" >"$quality_out/diloco.yaml"
  cat >>"$quality_out/diloco.yaml" <<YAML
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
  echo '[]' >"$quality_out/runs.json"
}

quality_row() {
  local name="$1" kind="$2" seed="$3"
  shift 3
  local cfg="$quality_out/sync.yaml" cmd=(train)
  [[ $kind == diloco ]] && { cfg="$quality_out/diloco.yaml"; cmd=(launch --plain); }
  local dir="$quality_out/$name-$seed"
  "$quality_bin" "${cmd[0]}" "$cfg" "${cmd[@]:1}" --set run.seed="$seed" --set run.output_dir="$dir" "$@" \
    >"$dir.log" 2>&1 || { tail -20 "$dir.log" >&2; return 1; }
  local val bytes
  val="$(jq -r '.val_loss' "$dir/summary.json")"
  bytes="$(jq -r '.wan_bytes_sent_total // 0' "$dir/summary.json")"
  echo "$name seed $seed: val $val, WAN bytes $bytes"
  jq --arg r "$name" --arg k "$kind" --argjson s "$seed" --argjson v "$val" --argjson b "$bytes" \
    '. + [{row: $r, kind: $k, seed: $s, val_loss: $v, wan_bytes: $b}]' "$quality_out/runs.json" \
    >"$quality_out/runs.tmp" && mv "$quality_out/runs.tmp" "$quality_out/runs.json"
}

quality_summary() {
  local out="$1" result="$2" setting="$3"
  mkdir -p "$(dirname "$result")"
  jq --arg setting "$setting" '{format: "geoloco-bench-quality", version: 1, setting: $setting, runs: .,
     rows: (group_by(.row) | map({row: .[0].row, kind: .[0].kind, seeds: [.[].seed],
            mean: ([.[].val_loss] | add / length), min: ([.[].val_loss] | min), max: ([.[].val_loss] | max),
            wan_bytes_mean: ([.[].wan_bytes] | add / length)}))}' "$out/runs.json" >"$result"
  jq -c '.rows[]' "$result"
}

#!/usr/bin/env bash
# bench/quality/grid.sh: the quality issue's default grid on the small setting (lib.sh), 3 seeds
# per row, about 15 minutes per seed on 2 cores. Rows, AdamW inside unless named:
#   sync                 the synchronous peer (1 rank x 32 sequences)
#   one-site             one site alone (1 rank x 8: a quarter of the tokens)
#   diloco-h{10,25,50,100}   DiLoCo fp32 at each H with the outer lr and momentum that
#                        tune.sh found best for that H (read from results/tune.json)
#   streaming-f2         H 50, 2 fragments, overlapped by 5 steps (tau 5); 4 fragments need 4
#                        blocks and this model has 2 (outer.fragments <= n_layer)
#   int8-ef, int4-ef, int2-ef   H 50, blockwise (4096) with error feedback, zstd 3
#   warm-start           100 synchronous steps, then DiLoCo H 50 for the other 900 (same tokens)
#   muloco-h50           Muon inside DiLoCo (the default Muon settings), H 50, fp32
# Writes results/grid.json. Needs results/tune.json (run bench/quality/tune.sh first).
#   bench/quality/grid.sh [--seeds "1 2 3"] [--out DIR]
set -euo pipefail
source "$(dirname "$0")/lib.sh"
quality_args "$@"
tune="$quality_root/bench/quality/results/tune.json"
[[ -f $tune ]] || { echo "grid.sh: $tune is missing: run bench/quality/tune.sh first" >&2; exit 2; }
# The best (lowest mean loss) outer lr and momentum for H, from the tuning rows h<H>-lr<lr>-m<m>.
tuned() {
  jq -r --arg h "h$1-" '[.rows[] | select(.row | startswith($h))] | min_by(.mean) | .row' "$tune" |
    sed -E 's/^h[0-9]+-lr([0-9.]+)-m([0-9.]+)$/outer.optimizer={kind: nesterov, lr: \1, momentum: \2}/'
}
h50="$(tuned 50)"
echo "tuned: H 10: $(tuned 10); H 25: $(tuned 25); H 50: $h50; H 100: $(tuned 100)"
codec() { echo "outer.compression={codec: $1, block: 4096, error_feedback: true, zstd_level: 3}"; }
for seed in $quality_seeds; do
  quality_row sync sync "$seed"
  quality_row one-site sync "$seed" --set train.micro_batch=8
  for h in 10 25 50 100; do
    quality_row "diloco-h$h" diloco "$seed" --set outer.interval="$h" --set "$(tuned "$h")"
  done
  quality_row streaming-f2 diloco "$seed" --set "$h50" --set outer.fragments=2 --set outer.overlap_steps=5
  for c in int8 int4 int2; do
    quality_row "$c-ef" diloco "$seed" --set "$h50" --set "$(codec $c)"
  done
  # Warm start: the first 100 steps synchronous (its own output), then DiLoCo from that model.
  warm="$quality_out/warm-phase-$seed"
  "$quality_bin" train "$quality_out/sync.yaml" --set run.seed="$seed" --set run.output_dir="$warm" \
    --set train.steps=100 >"$warm.log" 2>&1 || { tail -20 "$warm.log" >&2; exit 1; }
  quality_row warm-start diloco "$seed" --set "$h50" --set train.init_from="$warm" --set train.steps=900
  quality_row muloco-h50 diloco "$seed" --set "$h50" --set "train.optimizer={kind: muon, lr: 1.0e-3}"
done
quality_summary "$quality_out" "$quality_root/bench/quality/results/grid.json" \
  "2 layers d 128, 4 heads, T 64, bytes, 1000 steps x 32 sequences (warm start: 100 sync + 900 DiLoCo), AdamW 1e-3 warmup 50 cosine to 1e-4; sync 1 rank x 32; DiLoCo 4 sites x 1 rank x 8, fp32 unless named, outer lr/momentum per H from tune.json"

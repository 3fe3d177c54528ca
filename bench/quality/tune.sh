#!/usr/bin/env bash
# bench/quality/tune.sh: the outer learning rate and momentum against H on the small quality
# grid (lib.sh): DiLoCo (4 sites x 1 rank, AdamW inside, fp32 pseudo-gradients, Nesterov) at
# H in {10, 25, 50, 100} x outer lr in {0.5, 0.7, 1.0} with momentum 0.9, and momentum 0.8 and
# 0.95 at H 50 / lr 0.7; one seed by default (a tuning pass: 14 runs, about half an hour).
# Writes results/tune.json; docs/quality.md reads the H floor and the lr/H coupling from it.
#   bench/quality/tune.sh [--seeds "1"] [--out DIR]
set -euo pipefail
source "$(dirname "$0")/lib.sh"
quality_args --seeds 1 "$@"
nesterov() { echo "outer.optimizer={kind: nesterov, lr: $1, momentum: $2}"; }
for seed in $quality_seeds; do
  for h in 10 25 50 100; do
    for lr in 0.5 0.7 1.0; do
      quality_row "h$h-lr$lr-m0.9" diloco "$seed" --set outer.interval="$h" --set "$(nesterov "$lr" 0.9)"
    done
  done
  for m in 0.8 0.95; do
    quality_row "h50-lr0.7-m$m" diloco "$seed" --set outer.interval=50 --set "$(nesterov 0.7 "$m")"
  done
done
quality_summary "$quality_out" "$quality_root/bench/quality/results/tune.json" \
  "DiLoCo 4 sites x 1 rank x 8, AdamW 1e-3 inside, fp32, Nesterov; H x outer lr x momentum; 2 layers d 128, T 64, bytes, 1000 steps x 32 sequences"

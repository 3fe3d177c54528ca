#!/usr/bin/env bash
# bench/quality/windows.sh: aligned vs random training windows (data.windows) on the small
# quality grid (lib.sh), synchronous (one site) and DiLoCo (4 sites x 1 rank, H = 50), 3 seeds
# each; writes results/windows.json (rows sync-aligned, sync-random, diloco-aligned,
# diloco-random: mean, min, max of the final validation loss).
#   bench/quality/windows.sh [--seeds "1 2 3"] [--out DIR]
set -euo pipefail
source "$(dirname "$0")/lib.sh"
quality_args "$@"
for seed in $quality_seeds; do
  for kind in sync diloco; do
    for windows in aligned random; do
      quality_row "$kind-$windows" "$kind" "$seed" --set data.windows="$windows"
    done
  done
done
quality_summary "$quality_out" "$quality_root/bench/quality/results/windows.json" \
  "2 layers d 128, 4 heads, T 64, bytes, 1000 steps x 32 sequences, AdamW 1e-3; sync: 1 rank x 32; DiLoCo: 4 sites x 1 rank x 8, H 50, Nesterov 0.7/0.9, fp32; data.windows aligned vs random"

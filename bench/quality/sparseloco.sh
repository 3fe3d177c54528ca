#!/usr/bin/env bash
# bench/quality/sparseloco.sh: on the small quality grid (lib.sh), 3 seeds each, DiLoCo at
# H = 50 with fp32 pseudo-gradients and Nesterov (the reference), 2-bit top-2% with error
# feedback and Nesterov, and SparseLoCo (the same 2-bit top-2% frames, error feedback decayed
# by 0.95 as the momentum, outer lr 1), and both again at 10% kept; writes
# results/sparseloco.json.
#   bench/quality/sparseloco.sh [--seeds "1 2 3"] [--out DIR]
set -euo pipefail
source "$(dirname "$0")/lib.sh"
quality_args "$@"
for seed in $quality_seeds; do
  quality_row diloco-fp32 diloco "$seed"
  quality_row diloco-int2-top2-nesterov diloco "$seed" \
    --set "outer.compression={codec: int2, block: 4096, topk: 0.02, error_feedback: true}"
  quality_row sparseloco-int2-top2 diloco "$seed" \
    --set "outer.compression={codec: int2, block: 4096, topk: 0.02}" \
    --set "outer.optimizer={kind: sparseloco, lr: 1.0, ef_decay: 0.95}"
  # Denser: 10% kept per block.
  quality_row diloco-int2-top10-nesterov diloco "$seed" \
    --set "outer.compression={codec: int2, block: 4096, topk: 0.1, error_feedback: true}"
  quality_row sparseloco-int2-top10 diloco "$seed" \
    --set "outer.compression={codec: int2, block: 4096, topk: 0.1}" \
    --set "outer.optimizer={kind: sparseloco, lr: 1.0, ef_decay: 0.95}"
done
quality_summary "$quality_out" "$quality_root/bench/quality/results/sparseloco.json" \
  "DiLoCo 4 sites x 1 rank, H 50, 2 layers d 128, T 64, bytes, 1000 steps x 32 sequences; fp32+Nesterov 0.7/0.9 vs int2 top-2% EF+Nesterov vs SparseLoCo (int2 top-2%, EF decay 0.95, lr 1); the same two at top-10%"

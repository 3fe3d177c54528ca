#!/usr/bin/env bash
# bench/quality/muon.sh: Muon as the inner optimizer (train.optimizer.kind: muon, spectral scale)
# on the small quality grid (lib.sh), 3 seeds each: synchronous Muon and MuLoCo (Muon inside
# DiLoCo, 4 sites x 1 rank, H 50, Nesterov 0.7/0.9, fp32) at matrix lr 0.02 and 0.04; MuLoCo
# 0.02 with SparseLoCo (int2, top-2%, EF decay 0.95, outer lr 1) at H 50 and with SparseLoCo
# top-10% at H 100. AdamW's rows (synchronous, DiLoCo fp32) are in windows.json and
# sparseloco.json (same configs, same bits). Writes results/muon.json.
#   bench/quality/muon.sh [--seeds "1 2 3"] [--out DIR]
set -euo pipefail
source "$(dirname "$0")/lib.sh"
quality_args "$@"
muon() { echo "train.optimizer={kind: muon, lr: 1.0e-3, muon: {lr: $1, scale: spectral}}"; }
sparseloco=(--set "outer.optimizer={kind: sparseloco, lr: 1.0, ef_decay: 0.95}")
for seed in $quality_seeds; do
  for lr in 0.02 0.04; do
    quality_row "sync-muon-$lr" sync "$seed" --set "$(muon $lr)"
    quality_row "muloco-$lr-fp32" diloco "$seed" --set "$(muon $lr)"
  done
  quality_row muloco-0.02-sparseloco-int2-top2 diloco "$seed" --set "$(muon 0.02)" \
    --set "outer.compression={codec: int2, block: 4096, topk: 0.02}" "${sparseloco[@]}"
  quality_row muloco-0.02-sparseloco-int2-top10-h100 diloco "$seed" --set "$(muon 0.02)" \
    --set "outer.compression={codec: int2, block: 4096, topk: 0.1}" "${sparseloco[@]}" --set outer.interval=100
done
quality_summary "$quality_out" "$quality_root/bench/quality/results/muon.json" \
  "2 layers d 128, 4 heads, T 64, bytes, 1000 steps x 32 sequences; Muon (spectral scale, matrix lr 0.02 / 0.04, momentum 0.95 Nesterov, 5 Newton-Schulz steps) with AdamW 1e-3 on embeddings, biases, LayerNorm; sync: 1 rank x 32; MuLoCo: 4 sites x 1 rank x 8, H 50 (100 where named), Nesterov 0.7/0.9 fp32 or SparseLoCo int2 top-k"

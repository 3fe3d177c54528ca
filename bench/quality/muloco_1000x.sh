#!/usr/bin/env bash
# bench/quality/muloco_1000x.sh: MuLoCo (the Muon defaults inside DiLoCo, outer Nesterov lr 0.7
# momentum 0.8: configs/muloco.yaml's step) with 2-bit pseudo-gradients, error feedback and
# zstd at H 125 -- 8 rounds of 1000 steps, about 9 MB over the run, over 1000x fewer bytes than
# per-step data parallelism -- on the small quality grid (lib.sh), 3 seeds; writes
# results/muloco_1000x.json.
#   bench/quality/muloco_1000x.sh [--seeds "1 2 3"] [--out DIR]
set -euo pipefail
source "$(dirname "$0")/lib.sh"
quality_args "$@"
for seed in $quality_seeds; do
  quality_row muloco-h125-int2-ef diloco "$seed" --set outer.interval=125 \
    --set "outer.optimizer={kind: nesterov, lr: 0.7, momentum: 0.8}" \
    --set "outer.compression={codec: int2, block: 4096, error_feedback: true, zstd_level: 3}" \
    --set "train.optimizer={kind: muon, lr: 1.0e-3}"
done
quality_summary "$quality_out" "$quality_root/bench/quality/results/muloco_1000x.json" \
  "MuLoCo (Muon defaults, AdamW 1e-3 elsewhere) 4 sites x 1 rank x 8, H 125, Nesterov 0.7/0.8, int2 block 4096 + EF + zstd 3; 2 layers d 128, T 64, bytes, 1000 steps x 32 sequences"

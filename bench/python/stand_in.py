#!/usr/bin/env python3
"""bench/python's PyTorch rank: geoloco.OuterLoop over BENCH_PARAMS float32 parameters (8 blocks of
matrices), behind a stand-in inner step like the native rehearsal's (train.rehearsal): a small
drift of every parameter, then a sleep to BENCH_STEP_S seconds. Started by `geoloco launch`."""

from __future__ import annotations

import os
import time

import torch

import geoloco


def main() -> None:
    total = int(os.environ["BENCH_PARAMS"])
    step_s = float(os.environ.get("BENCH_STEP_S", "0.1"))
    cols = 1024
    rows = total // cols
    blocks = 8
    # End to end in one buffer (as geoloco.flatten_parameters leaves a model): synced in place.
    flat = torch.zeros(total)
    params, at = [], 0
    for b in range(blocks):
        r = rows // blocks + (1 if b < rows % blocks else 0)
        params.append((f"h.{b}.w", flat[at : at + r * cols].view(r, cols)))
        at += r * cols
    if total - at:
        params.append(("tail", flat[at:]))
    torch.manual_seed(1)
    for _, p in params:
        p.normal_(0.0, 0.02)
    deltas = [torch.randn(p.shape) * 1e-5 for _, p in params]
    outer = geoloco.OuterLoop(params, tokens_per_step=1024)
    for step in range(outer.start_step + 1, outer.total_steps + 1):
        t0 = time.monotonic()
        sign = 1.0 if step % 2 else -0.5
        for (_, p), d in zip(params, deltas):
            p.add_(d, alpha=sign)
        time.sleep(max(0.0, step_s - (time.monotonic() - t0)))
        outer.step()
    outer.finish()


if __name__ == "__main__":
    main()

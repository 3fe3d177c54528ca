#!/usr/bin/env python3
"""The package's side of tests/python/test_exactness.py: one site of one rank holding the native
test double's toy model (tests/outer_optimizer/fake_site.hpp), moved by the same deterministic
drift, synced by geoloco.OuterLoop. Writes {"hash", "params"} to $GEOLOCO_TEST_OUT/<site>.json."""

from __future__ import annotations

import json
import math
import os

import torch

import geoloco


def toy_model(blocks: int = 4, width: int = 16, vocab: int = 48) -> list[tuple[str, torch.Tensor]]:
    shapes: list[tuple[str, tuple[int, ...]]] = [("embed", (vocab, width))]
    for b in range(blocks):
        shapes += [(f"blocks.{b}.w", (width, width)), (f"blocks.{b}.b", (width,))]
    shapes.append(("norm", (width,)))
    total = sum(math.prod(s) for _, s in shapes)
    # toy_init: 0.02f * float(sin(0.5 * i)), in float32 as the C++ computes it
    init = torch.tensor([math.sin(0.5 * i) for i in range(total)], dtype=torch.float64).float()
    init = torch.tensor(0.02, dtype=torch.float32) * init
    out, at = [], 0
    for name, shape in shapes:
        n = math.prod(shape)
        out.append((name, init[at : at + n].clone().reshape(shape)))
        at += n
    return out


def main() -> None:
    launch = geoloco.LaunchEnv.from_environ()
    site = int(os.environ["GEOLOCO_SITE_INDEX"])
    params = toy_model()
    if os.environ.get("GEOLOCO_TEST_EXTRA_PARAM_SITE") == launch.site:
        params.append(("extra", torch.zeros(4)))  # a model that differs from the other sites'
    outer = geoloco.OuterLoop(params, tokens_per_step=1000)
    flat_n = sum(p.numel() for _, p in params)
    step_rate = torch.tensor(0.01, dtype=torch.float32)
    for step in range(1, outer.total_steps + 1):
        if outer.trains_step():
            # FakeSite::train: params[i] -= 0.01f * float(sin(0.37 i + 1.3 site + 0.11 step))
            drift = torch.tensor(
                [math.sin(0.37 * i + 1.3 * site + 0.11 * step) for i in range(flat_n)], dtype=torch.float64
            ).float()
            drift = step_rate * drift
            at = 0
            for _, p in params:
                n = p.numel()
                p.sub_(drift[at : at + n].reshape(p.shape))
                at += n
        outer.step()
    outer.finish()
    flat = torch.cat([p.reshape(-1) for _, p in params])
    with open(os.path.join(os.environ["GEOLOCO_TEST_OUT"], f"{launch.site}.json"), "w") as f:
        json.dump({"hash": outer.global_weights_hash, "params": flat.tolist()}, f)


if __name__ == "__main__":
    main()

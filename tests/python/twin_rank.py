#!/usr/bin/env python3
"""The package's side of tests/python/test_exactness.py: a site holding the native test double's
toy model (tests/outer_optimizer/fake_site.hpp), moved by the same deterministic drift, synced by
geoloco.OuterLoop. Writes {"hash", "params"} to $GEOLOCO_TEST_OUT/<site>.json.

GEOLOCO_TEST_SHARDED=1: a hand-written sharded loop -- each rank of the site holds only its shard of
the flat parameters (geoloco.shard_range) and moves only those; the full weights are gathered at the end."""

from __future__ import annotations

import json
import math
import os

import torch
import torch.distributed as dist

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


def drift(site: int, step: int, begin: int, end: int) -> torch.Tensor:
    """FakeSite::train's step for values [begin, end): 0.01f * float(sin(0.37 i + 1.3 site + 0.11 step))."""
    d = torch.tensor([math.sin(0.37 * i + 1.3 * site + 0.11 * step) for i in range(begin, end)],
                     dtype=torch.float64).float()
    return torch.tensor(0.01, dtype=torch.float32) * d


def main() -> None:
    launch = geoloco.LaunchEnv.from_environ()
    site = int(os.environ["GEOLOCO_SITE_INDEX"])
    ranks = int(os.environ.get("WORLD_SIZE", "1"))
    if ranks > 1:
        dist.init_process_group("gloo")
    params = toy_model()
    if os.environ.get("GEOLOCO_TEST_EXTRA_PARAM_SITE") == launch.site:
        params.append(("extra", torch.zeros(4)))  # a model that differs from the other sites'
    flat_n = sum(p.numel() for _, p in params)
    if os.environ.get("GEOLOCO_TEST_SHARDED") == "1":
        offset, count = geoloco.shard_range(flat_n, launch.rank, ranks)
        shard = torch.cat([p.reshape(-1) for _, p in params])[offset : offset + count].clone()
        held = [("shard", shard)]
        outer = geoloco.OuterLoop(held, tokens_per_step=1000, layout=[(n, list(p.shape)) for n, p in params])
    else:
        offset, count = 0, flat_n
        held = params
        if os.environ.get("GEOLOCO_TEST_FLAT") == "1":
            # End to end in one buffer: the outer loop works on them in place (no copy).
            module = torch.nn.Module()
            for i, (name, p) in enumerate(params):
                module.register_parameter(f"p{i}", torch.nn.Parameter(p, requires_grad=False))
            geoloco.flatten_parameters(module)
            held = [(name, p.data) for (name, _), p in zip(params, module.parameters())]
        outer = geoloco.OuterLoop(held, tokens_per_step=1000)
    for step in range(1, outer.total_steps + 1):
        if outer.trains_step():
            d, at = drift(site, step, offset, offset + count), 0
            for _, p in held:
                n = p.numel()
                p.sub_(d[at : at + n].reshape(p.shape))
                at += n
        outer.step()
    outer.finish()
    mine = torch.cat([p.reshape(-1) for _, p in held])
    if count != flat_n:
        parts: list = [None] * ranks
        dist.all_gather_object(parts, mine.tolist())
        values = [v for part in parts for v in part]
    else:
        values = mine.tolist()
    if launch.rank == 0:
        with open(os.path.join(os.environ["GEOLOCO_TEST_OUT"], f"{launch.site}.json"), "w") as f:
            json.dump({"hash": outer.global_weights_hash, "params": values, "in_place": outer.in_place}, f)
    if ranks > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

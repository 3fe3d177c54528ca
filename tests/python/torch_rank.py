#!/usr/bin/env python3
"""One rank of a test run: a tiny PyTorch model under DDP (gloo) inside its site, geoloco's outer
loop between sites. Started by `geoloco launch` (run.command) from tests/python/test_launch_torch.py.

GEOLOCO_TEST_KILL="<site>:<rank>:<step>": that rank SIGKILLs itself after that inner step, unless it
is a restarted (joining) process -- a site lost mid-run, as a machine failure would lose it.
GEOLOCO_TEST_EXIT_AT=<step>: every rank exits (code 3) after that step, unless it resumed -- a run
stopped between its checkpoints.
GEOLOCO_TEST_ZERO=1: the inner optimizer is torch's ZeroRedundancyOptimizer (AdamW sharded over the site).
GEOLOCO_TEST_STEP_S: seconds each inner step takes at least (a model's compute), so the run outlasts
a restart.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

import geoloco


class Net(nn.Module):
    """An embedding and four layers (blocks h.0 .. h.3: two fragments take two each)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(32, 16)
        self.h = nn.ModuleList(nn.Linear(16, 16) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.emb(x)
        for layer in self.h:
            h = torch.tanh(layer(h))
        return h.sum(dim=-1)


def main() -> None:
    launch = geoloco.LaunchEnv.from_environ()
    ranks = int(os.environ["WORLD_SIZE"])
    if ranks > 1:
        dist.init_process_group("gloo")
    torch.manual_seed(7)
    model = Net()
    if os.environ.get("GEOLOCO_TEST_EXTRA_PARAM") == f"{launch.site}:{launch.rank}":
        model.extra = nn.Parameter(torch.zeros(3))  # this rank's model differs from its site's
    if os.environ.get("GEOLOCO_TEST_ZERO") == "1" and ranks > 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        # Every rank holds the full parameters and a shard of AdamW's state.
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-2)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=7, gamma=0.9)
    outer = geoloco.OuterLoop(model, optimizer=opt, scheduler=sched, tokens_per_step=64 * ranks)
    ddp = nn.parallel.DistributedDataParallel(model) if ranks > 1 else model
    kill = os.environ.get("GEOLOCO_TEST_KILL", "")
    me = int(os.environ["GEOLOCO_GLOBAL_RANK"])
    exit_at = int(os.environ.get("GEOLOCO_TEST_EXIT_AT", "0"))
    if outer.joined:
        print(f"joined at step {outer.start_step} with hash {outer.global_weights_hash}", flush=True)

    step_s = float(os.environ.get("GEOLOCO_TEST_STEP_S", "0"))
    for step in range(outer.start_step + 1, outer.total_steps + 1):
        t0 = time.monotonic()
        # Each step's batch depends on the rank and the step only: a resumed run reads what it would have.
        gen = torch.Generator().manual_seed(1000 + me * 7919 + step * 131)
        x = torch.randint(0, 32, (64,), generator=gen)
        target = (x % 5).float()
        loss = ((ddp(x) - target) ** 2).mean()  # under DDP, its hooks all-reduce the gradient
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        time.sleep(max(0.0, step_s - (time.monotonic() - t0)))
        outer.step(loss)
        if exit_at and step == exit_at and not outer.resumed:
            print(f"stopping after step {step}", flush=True)
            os._exit(3)
        if kill and not outer.joined:
            site, rank, at = kill.split(":")
            if site == launch.site and int(rank) == launch.rank and step == int(at):
                print(f"killing myself after step {step}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
    summary = outer.finish()
    result = {"site": launch.site, "rank": launch.rank, "hash": outer.global_weights_hash, "joined": outer.joined,
              "resumed": outer.resumed, "start_step": outer.start_step if outer.resumed else 0,
              "outer_steps": summary.get("outer_steps")}
    out = os.environ["GEOLOCO_TEST_OUT"]
    with open(os.path.join(out, f"{launch.site}.{launch.rank}.json"), "w") as f:
        json.dump(result, f)
    if ranks > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())

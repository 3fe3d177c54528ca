#!/usr/bin/env python3
"""A small GPT in plain PyTorch, trained across campuses with geoloco's outer loop.

Each campus runs this script on every one of its ranks: DistributedDataParallel over gloo
inside the campus (torchrun's environment, set by ``geoloco launch``), its own AdamW and
cosine schedule; ``geoloco.OuterLoop`` syncs the campuses every ``outer.interval`` steps.

    build/geoloco launch examples/torch/two-campus.yaml

Data: byte-level text from Debian's license texts (/usr/share/common-licenses), each rank of
each site reading its own windows (geoloco.WindowSampler: disjoint across every rank of every site).
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import geoloco


class Block(nn.Module):
    """A pre-norm transformer block: causal self-attention and an MLP."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)
        self.heads = heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    """GPT-2's layout: token and position embeddings, blocks ``h.<i>``, a final norm, a tied head."""

    def __init__(self, vocab: int, block_size: int, layers: int, heads: int, d: int) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(block_size, d)
        self.h = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.ln_f(x) @ self.wte.weight.t()


def load_bytes(root: Path) -> torch.Tensor:
    data = b"".join(p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file())
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).long()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="/usr/share/common-licenses")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()

    launch = geoloco.LaunchEnv.from_environ()
    ranks = int(os.environ.get("WORLD_SIZE", "1"))
    if ranks > 1:
        dist.init_process_group("gloo")  # the site's ranks: MASTER_ADDR/MASTER_PORT from geoloco launch
    torch.manual_seed(args.seed)  # every rank of every site starts from the same weights
    model = GPT(256, args.block_size, args.layers, args.heads, args.width)
    geoloco.flatten_parameters(model)  # one buffer: the outer loop syncs it in place, no copies
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    # Warmup and cosine decay over the run's steps (train.steps, known once the outer loop is built).
    total = [1]
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 20) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(s, total[0]) / total[0])))
    )
    tokens_per_step = args.micro_batch * args.block_size * ranks
    # geoloco's outer loop over this model; optimizer and scheduler go into its checkpoints.
    outer = geoloco.OuterLoop(model, optimizer=opt, scheduler=sched, tokens_per_step=tokens_per_step)
    total[0] = steps = outer.total_steps
    ddp = nn.parallel.DistributedDataParallel(model) if ranks > 1 else model

    data = load_bytes(Path(args.data))
    # geoloco's data contract: windows disjoint over every rank of every site, resumable (a
    # restarted site that joins at step k reads what it would have read from step k).
    n_windows = (len(data) - 1) // args.block_size
    windows = iter(geoloco.WindowSampler(n_windows, batch_size=args.micro_batch, seed=args.seed,
                                         start_step=outer.start_step))

    for step in range(outer.start_step + 1, steps + 1):
        starts = [next(windows) * args.block_size for _ in range(args.micro_batch)]
        x = torch.stack([data[i : i + args.block_size] for i in starts])
        y = torch.stack([data[i + 1 : i + 1 + args.block_size] for i in starts])
        loss = F.cross_entropy(ddp(x).reshape(-1, 256), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        outer.step(loss)
    summary = outer.finish()
    if launch.rank == 0:
        print(f"site {launch.site}: global weights {outer.global_weights_hash} after {summary['steps']} steps")
    if ranks > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Captures real DiLoCo pseudo-gradients from a small PyTorch GPT trained on bytes of a text
file, as raw little-endian fp32 (the format bench_codecs --real reads), until the geoloco
trainer can dump its own.

    /usr/bin/python3 bench/compression/capture_pseudo_gradients.py OUT.f32 [--text FILE]
        [--warmup 300] [--inner 50] [--outer 2] [--seed 0] [--d 128] [--layers 2] [--batch 8]

Trains `warmup` AdamW steps, then for each of `outer` rounds records theta, trains `inner`
steps (DiLoCo's H) and appends theta_before - theta_after of every parameter (in
model.parameters() order) to OUT. One thread, CPU; deterministic for a given seed.
"""
import argparse
import math
import struct
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x, mask):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class Gpt(nn.Module):
    def __init__(self, vocab=256, d=128, heads=4, layers=2, seq=64):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList([Block(d, heads) for _ in range(layers)])
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.register_buffer("mask", torch.triu(torch.full((seq, seq), float("-inf")), 1))

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t))
        for b in self.blocks:
            x = b(x, self.mask[:t, :t])
        return self.head(self.ln(x))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--text", default="/usr/share/common-licenses/GPL-3")
    ap.add_argument("--warmup", type=int, default=300)
    ap.add_argument("--inner", type=int, default=50)
    ap.add_argument("--outer", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--d", type=int, default=128, help="model width (heads = d / 32)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    torch.set_num_threads(1)
    data = torch.tensor(list(open(a.text, "rb").read()), dtype=torch.long)
    model = Gpt(d=a.d, heads=max(1, a.d // 32), layers=a.layers)
    print(f"{sum(p.numel() for p in model.parameters())} parameters", file=sys.stderr)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    seq, batch = 64, a.batch

    def step():
        ix = torch.randint(0, len(data) - seq - 1, (batch,))
        x = torch.stack([data[i:i + seq] for i in ix])
        y = torch.stack([data[i + 1:i + seq + 1] for i in ix])
        loss = F.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()

    for _ in range(a.warmup):
        loss = step()
    print(f"after warmup: loss {loss:.3f}", file=sys.stderr)
    with open(a.out, "wb") as f:
        for r in range(a.outer):
            before = [p.detach().clone() for p in model.parameters()]
            for _ in range(a.inner):
                loss = step()
            delta = torch.cat([(b - p.detach()).reshape(-1) for b, p in zip(before, model.parameters())])
            assert torch.isfinite(delta).all()
            f.write(delta.numpy().astype("<f4").tobytes())
            print(f"outer {r}: loss {loss:.3f}, {delta.numel()} values, |delta| rms {delta.pow(2).mean().sqrt():.3e}",
                  file=sys.stderr)


if __name__ == "__main__":
    main()

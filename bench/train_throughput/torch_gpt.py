#!/usr/bin/env python3
"""PyTorch peer for bench/train_throughput: the same GPT-2 as geoloco's trainer/model
(learned position embedding, pre-LayerNorm blocks, GELU tanh, tied LM head, eps 1e-5),
timed for fwd + bwd + AdamW steps on random byte tokens. Prints one JSON document.

Run with Debian's interpreter: /usr/bin/python3 torch_gpt.py --threads 1 ...
"""
import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, c, n_head):
        super().__init__()
        self.n_head = n_head
        self.ln_1 = nn.LayerNorm(c, eps=1e-5)
        self.c_attn = nn.Linear(c, 3 * c)
        self.c_proj = nn.Linear(c, c)
        self.ln_2 = nn.LayerNorm(c, eps=1e-5)
        self.c_fc = nn.Linear(c, 4 * c)
        self.mlp_proj = nn.Linear(4 * c, c)

    def attn(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        hs = c // self.n_head
        q = q.view(b, t, self.n_head, hs).transpose(1, 2)
        k = k.view(b, t, self.n_head, hs).transpose(1, 2)
        v = v.view(b, t, self.n_head, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        return self.c_proj(y)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))
        return x


class Gpt(nn.Module):
    def __init__(self, n_layer, n_head, n_embd, block_size, vocab_size):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.h = nn.ModuleList([Block(n_embd, n_head) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd, eps=1e-5)

    def forward(self, idx, targets):
        _, t = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(t))
        for blk in self.h:
            x = blk(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied head
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n_layer", type=int, default=2)
    ap.add_argument("--n_head", type=int, default=4)
    ap.add_argument("--n_embd", type=int, default=128)
    ap.add_argument("--block_size", type=int, default=64)
    ap.add_argument("--vocab_size", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    model = Gpt(a.n_layer, a.n_head, a.n_embd, a.block_size, a.vocab_size)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    n_params = sum(p.numel() for p in model.parameters())
    x = torch.randint(0, a.vocab_size, (a.batch, a.seq))
    y = torch.randint(0, a.vocab_size, (a.batch, a.seq))

    def step():
        opt.zero_grad(set_to_none=True)
        loss = model(x, y)
        loss.backward()
        opt.step()
        return loss

    for _ in range(a.warmup):
        step()
    c0, t0 = time.process_time(), time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    dt = time.perf_counter() - t0
    cpu = time.process_time() - c0
    print(json.dumps({
        "impl": "pytorch", "torch_version": torch.__version__, "threads": a.threads,
        "n_layer": a.n_layer, "n_head": a.n_head, "n_embd": a.n_embd, "block_size": a.block_size,
        "vocab_size": a.vocab_size, "batch": a.batch, "seq": a.seq, "n_params": n_params,
        "steps": a.steps, "seconds": dt, "steps_per_s": a.steps / dt,
        "tokens_per_s": a.steps * a.batch * a.seq / dt, "cpu_seconds": cpu,
        "tokens_per_cpu_s": a.steps * a.batch * a.seq / cpu, "final_loss": float(loss),
    }))


if __name__ == "__main__":
    main()

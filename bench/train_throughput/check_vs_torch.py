#!/usr/bin/env python3
"""Cross-checks geoloco's GPT-2 forward/backward against PyTorch (the llm.c test_gpt2 idea).

  bench_model_step --dump_dir DIR [config flags]     # one fwd+bwd: x, y, params, grads, meta.json
  /usr/bin/python3 check_vs_torch.py DIR

Loads geoloco's flat parameter buffer into torch_gpt.Gpt (the flat layout is the one
trainer/model/param_layout.hpp documents; Linear weights are transposed from HF Conv1D
[in, out] to torch's [out, in]), runs it in float64, and compares the loss and every
gradient tensor. Prints JSON with the max abs difference per tensor; exits 1 when the loss
differs by more than 1e-5 relative or a tensor's gradient by more than 1e-3 of that
tensor's largest gradient (float32 vs float64 arithmetic through ~10 chained ops).
"""
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_gpt import Gpt  # noqa: E402


def layout(cfg):
    """(name, shape as stored, offset, torch parameter getter, transpose) in flat order."""
    C, V, T, L = cfg["n_embd"], cfg["vocab_size"], cfg["block_size"], cfg["n_layer"]
    out, off = [], 0

    def add(name, shape, get, transpose=False):
        nonlocal off
        out.append((name, shape, off, get, transpose))
        off += int(np.prod(shape))

    add("transformer.wte.weight", (V, C), lambda m: m.wte.weight)
    add("transformer.wpe.weight", (T, C), lambda m: m.wpe.weight)
    for i in range(L):
        p = f"transformer.h.{i}."
        b = lambda m, i=i: m.h[i]  # noqa: E731
        add(p + "ln_1.weight", (C,), lambda m, b=b: b(m).ln_1.weight)
        add(p + "ln_1.bias", (C,), lambda m, b=b: b(m).ln_1.bias)
        add(p + "attn.c_attn.weight", (C, 3 * C), lambda m, b=b: b(m).c_attn.weight, True)
        add(p + "attn.c_attn.bias", (3 * C,), lambda m, b=b: b(m).c_attn.bias)
        add(p + "attn.c_proj.weight", (C, C), lambda m, b=b: b(m).c_proj.weight, True)
        add(p + "attn.c_proj.bias", (C,), lambda m, b=b: b(m).c_proj.bias)
        add(p + "ln_2.weight", (C,), lambda m, b=b: b(m).ln_2.weight)
        add(p + "ln_2.bias", (C,), lambda m, b=b: b(m).ln_2.bias)
        add(p + "mlp.c_fc.weight", (C, 4 * C), lambda m, b=b: b(m).c_fc.weight, True)
        add(p + "mlp.c_fc.bias", (4 * C,), lambda m, b=b: b(m).c_fc.bias)
        add(p + "mlp.c_proj.weight", (4 * C, C), lambda m, b=b: b(m).mlp_proj.weight, True)
        add(p + "mlp.c_proj.bias", (C,), lambda m, b=b: b(m).mlp_proj.bias)
    add("transformer.ln_f.weight", (C,), lambda m: m.ln_f.weight)
    add("transformer.ln_f.bias", (C,), lambda m: m.ln_f.bias)
    return out, off


def main():
    d = sys.argv[1]
    meta = json.load(open(os.path.join(d, "meta.json")))
    x = torch.from_numpy(np.load(os.path.join(d, "x.npy")).astype(np.int64))
    y = torch.from_numpy(np.load(os.path.join(d, "y.npy")).astype(np.int64))
    params = np.load(os.path.join(d, "params.npy"))
    grads = np.load(os.path.join(d, "grads.npy"))
    views, total = layout(meta)
    if params.shape != (total,) or grads.shape != (total,):
        sys.exit(f"check_vs_torch: expected {total} floats, got params {params.shape} grads {grads.shape}")

    model = Gpt(meta["n_layer"], meta["n_head"], meta["n_embd"], meta["block_size"], meta["vocab_size"]).double()
    with torch.no_grad():
        for name, shape, off, get, tr in views:
            t = torch.from_numpy(params[off:off + int(np.prod(shape))].reshape(shape).astype(np.float64))
            get(model).copy_(t.t() if tr else t)
    loss = model(x, y)
    loss.backward()

    report, ok = {"loss_geoloco": meta["loss"], "loss_torch_f64": loss.item(), "tensors": {}}, True
    if abs(meta["loss"] - loss.item()) > 1e-5 * abs(loss.item()):
        ok = False
    for name, shape, off, get, tr in views:
        g_ref = get(model).grad
        g_ref = (g_ref.t() if tr else g_ref).numpy().reshape(-1)
        g = grads[off:off + int(np.prod(shape))].astype(np.float64)
        diff = float(np.max(np.abs(g - g_ref)))
        scale = float(np.max(np.abs(g_ref)))
        report["tensors"][name] = {"max_abs_diff": diff, "max_abs_grad": scale}
        if diff > 1e-3 * scale + 1e-12:
            ok = False
    report["ok"] = ok
    print(json.dumps(report, indent=1))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

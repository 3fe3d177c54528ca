#!/usr/bin/env python3
"""Concatenates pseudo-gradient shards captured by geoloco (geoloco launch --capture-pseudograd <dir>:
files pseudograd.<site>.r<rank>.round<k>.safetensors, tensor "delta", F32) into one raw
little-endian .f32 file of exactly --mib MiB, the input bench_codecs --real reads.

    python3 bench/compression/concat_pseudograds.py CAPTURE_DIR OUT.f32 [--mib 64]

Whole rounds are taken from the newest backwards (late rounds look more like steady-state
training than the first one), then written oldest first in (round, site, rank) order and
cut to exactly --mib MiB. Fails, naming the file, on anything that is not a well-formed
safetensors file with one F32 "delta" tensor, and when the capture holds too few values.
Prints one JSON line describing what went in. Standard library only.
"""
import argparse
import json
import math
import os
import re
import struct
import sys

NAME = re.compile(r"^pseudograd\.(?P<site>.+)\.r(?P<rank>\d+)\.round(?P<round>\d+)\.safetensors$")


def read_delta(path):
    """Returns the raw bytes of the F32 tensor "delta", after checking every bound."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise SystemExit(f"{path}: shorter than the 8-byte safetensors header length")
    (hlen,) = struct.unpack_from("<Q", blob, 0)
    if hlen > len(blob) - 8 or hlen > 100 * 2**20:
        raise SystemExit(f"{path}: header length {hlen} exceeds the file ({len(blob)} bytes)")
    try:
        header = json.loads(blob[8:8 + hlen])
    except ValueError as e:
        raise SystemExit(f"{path}: header is not JSON: {e}")
    t = header.get("delta")
    if not isinstance(t, dict):
        raise SystemExit(f"{path}: no tensor named 'delta'")
    if t.get("dtype") != "F32":
        raise SystemExit(f"{path}: tensor 'delta' has dtype {t.get('dtype')}, expected F32")
    shape = t.get("shape", [])
    n = math.prod(shape) if shape else 1
    lo, hi = t.get("data_offsets", [None, None])
    base = 8 + hlen
    if not (isinstance(lo, int) and isinstance(hi, int) and 0 <= lo <= hi and base + hi <= len(blob)):
        raise SystemExit(f"{path}: data_offsets {lo}..{hi} outside the data section")
    if hi - lo != 4 * n:
        raise SystemExit(f"{path}: data_offsets span {hi - lo} bytes, shape {shape} needs {4 * n}")
    return blob[base + lo:base + hi]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("capture_dir")
    ap.add_argument("out")
    ap.add_argument("--mib", type=int, default=64)
    a = ap.parse_args()
    files = []
    for name in os.listdir(a.capture_dir):
        m = NAME.match(name)
        if m:
            files.append((int(m["round"]), m["site"], int(m["rank"]), os.path.join(a.capture_dir, name)))
    if not files:
        raise SystemExit(f"{a.capture_dir}: no pseudograd.*.safetensors files")
    want = a.mib * 2**20
    rounds = sorted({f[0] for f in files}, reverse=True)
    chosen, have = [], 0
    for r in rounds:
        if have >= want:
            break
        for f in sorted(x for x in files if x[0] == r):
            chosen.append(f)
            have += os.path.getsize(f[3])  # upper bound; exact sizes are checked below
    chosen.sort()
    parts, total = [], 0
    for f in chosen:
        data = read_delta(f[3])
        parts.append(data)
        total += len(data)
    if total < want:
        raise SystemExit(f"{a.capture_dir}: capture holds {total} bytes of F32 deltas, need {want} "
                         f"(a bigger model or more rounds)")
    with open(a.out, "wb") as out:
        left = want
        for p in parts:
            take = min(left, len(p))
            out.write(p[:take])
            left -= take
            if left == 0:
                break
    print(json.dumps({"out": a.out, "values": want // 4, "mib": a.mib,
                      "rounds": sorted({f[0] for f in chosen}), "files": len(chosen),
                      "available_bytes": total, "sites": sorted({f[1] for f in chosen}),
                      "ranks": sorted({f[2] for f in chosen})}))


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Reads vs_resume.sh's runs and prints one JSON document.

Arguments after `--` come in triples: MODE WALL_S RUN_DIR, MODE elastic or resume. Per run,
from its summary.json: completed, steps, the final validation loss; for elastic, lyon's join
(round, step, seconds) and the evictions. Per mode: the median, min and max of the wall time
and of the loss, every run's values; the ratio elastic / resume of the medians.
"""
import argparse
import json

from benchlib import load_record, spread  # bench/lib.sh puts bench/ on PYTHONPATH
from summary_io import fail, load_json, set_prog

set_prog("vs_resume_summary.py")


def one_run(mode, wall, d, steps):
    s = load_json(f"{d}/summary.json")
    if s.get("completed") is not True or s.get("steps") != steps:
        fail(f"{d}: completed {s.get('completed')} steps {s.get('steps')}, expected {steps} completed")
    if "val_loss" not in s:
        fail(f"{d}: no val_loss in summary.json")
    r = {"wall_s": wall, "val_loss": s["val_loss"]}
    m = s.get("membership") or {}
    if mode == "elastic":
        joined = None
        for rank in s.get("ranks", []):
            if rank.get("site") == "lyon":
                joined = (rank.get("membership") or {}).get("joined")
        if not joined:
            fail(f"{d}: lyon did not rejoin (no membership.joined in its summary)")
        r["join"] = {k: joined.get(k) for k in ("round", "step", "seconds", "bytes_fetched")}
        r["evictions"] = m.get("evictions", [])
        if m.get("members") != ["paris", "lyon", "milan"]:
            fail(f"{d}: members at the end {m.get('members')}, expected all three")
    return r


def main():
    ap = argparse.ArgumentParser()
    for a in ("--steps", "--ckpt", "--seed"):
        ap.add_argument(a, type=int, required=True)
    ap.add_argument("--gap", type=float, required=True)
    ap.add_argument("runs", nargs="+")
    a = ap.parse_args()
    if len(a.runs) % 3:
        fail("runs come as MODE WALL DIR triples")
    per = {"elastic": [], "resume": []}
    for i in range(0, len(a.runs), 3):
        mode, wall, d = a.runs[i], float(a.runs[i + 1]), a.runs[i + 2]
        if mode not in per:
            fail(f"unknown mode {mode}")
        per[mode].append(one_run(mode, wall, d, a.steps))
    if not per["elastic"] or not per["resume"]:
        fail("needs runs of both modes")
    rows = {}
    for mode, rs in per.items():
        rows[mode] = {"wall_s": spread([r["wall_s"] for r in rs]), "val_loss": spread([r["val_loss"] for r in rs])}
    rows["elastic"]["joins"] = [r["join"] for r in per["elastic"]]
    rows["elastic"]["evictions"] = [r["evictions"] for r in per["elastic"]]
    print(json.dumps({
        "benchmark": "elastic/vs_resume",
        "config": "configs/elastic.yaml (3 sites x 1 rank, H 25), lyon SIGKILLed at the midpoint, back after gap_s",
        "steps": a.steps, "checkpoint_every": a.ckpt, "gap_s": a.gap, "seed": a.seed,
        "geoloco": "elastic: the others go on, the launcher restarts lyon with --join after gap_s",
        "peer": "stop-and-resume: min_sites 3, every site stops, the run is launched again with --resume after gap_s",
        "elastic": rows["elastic"],
        "resume": rows["resume"],
        "ratio_wall_elastic_over_resume": rows["elastic"]["wall_s"]["median"] / rows["resume"]["wall_s"]["median"],
        "ratio_val_loss_elastic_over_resume":
            rows["elastic"]["val_loss"]["median"] / rows["resume"]["val_loss"]["median"],
        **load_record(runs=len(per["elastic"])),
    }, indent=2))


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Reads the overlap-benchmark runs and prints one JSON document.

Arguments after `--` come in pairs: POINT RUN_DIR, POINT = F:tau:delayed:delay_ms:rate_mbit;
a point appears once per repeat (bench/lib.sh: the grid ran BENCH_RUNS times in turn). Every
figure is the median over the point's repeats; `runs` gives median, min, max and every value
of each. Per point:

  steady_utilization   sum(period_compute_s) / sum(period_wall_s) over every outer period of
                       global rank 0's metrics.jsonl but the last (the end-of-run blocking
                       sync, which every schedule pays once)
  run_utilization      summary compute_utilization (whole run, start-up excluded)
  exposed_wait_s       summary exposed_wait_s (inner loop blocked in the outer loop)
  val_loss             final validation loss (summary val_loss)
  vs_blocking          ratios to the peer: the F 1, tau 0, not delayed point with the same
                       delay and rate (utilization: this / peer; val_loss: this / peer)
"""
import argparse
import json
import statistics
import sys

import benchlib

FIGURES = ("steady_utilization", "run_utilization", "exposed_wait_s", "steady_exposed_wait_s", "val_loss",
           "final_loss", "sync_seconds_mean", "wall_s")


def fail(msg):
    print(f"summarize.py: {msg}", file=sys.stderr)
    sys.exit(1)


def load(point, d, steps):
    try:
        F, tau, delayed, delay, rate = point.split(":")
        key = {"fragments": int(F), "overlap_steps": int(tau), "delayed_update": delayed == "1",
               "delay_ms": float(delay), "rate_mbit": float(rate)}
    except ValueError:
        fail(f"bad grid point {point!r}")
    try:
        with open(f"{d}/summary.json") as f:
            s = json.load(f)
        periods = []
        with open(f"{d}/metrics.jsonl") as f:
            for line in f:
                j = json.loads(line)
                if "period_wall_s" in j:
                    periods.append(j)
    except (OSError, ValueError) as e:
        fail(f"{d}: {e}")
    if s.get("steps") != steps or s.get("completed") is not True:
        fail(f"{d}: steps {s.get('steps')} completed {s.get('completed')}, expected {steps} completed")
    if s.get("outer_fragments") != key["fragments"]:
        fail(f"{d}: ran {s.get('outer_fragments')} fragments, expected {key['fragments']}")
    if len(periods) < 2:
        fail(f"{d}: fewer than 2 outer periods in metrics.jsonl")
    steady = periods[:-1]
    wall = sum(p["period_wall_s"] for p in steady)
    comp = sum(p["period_compute_s"] for p in steady)
    row = dict(key)
    row.update({
        "steady_utilization": comp / wall if wall > 0 else 0.0,
        "run_utilization": s["compute_utilization"],
        "exposed_wait_s": s["exposed_wait_s"],
        "steady_exposed_wait_s": sum(p["exposed_wait_s"] for p in steady),
        "val_loss": s.get("val_loss"),
        "final_loss": s.get("final_loss"),
        "sync_seconds_mean": s.get("sync_seconds_mean"),
        "outer_rounds": s.get("outer_steps"),
        "wall_s": s.get("wall_s"),
    })
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--interval", type=int, required=True)
    ap.add_argument("rest", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    rest = a.rest[1:] if a.rest and a.rest[0] == "--" else a.rest
    if len(rest) % 2:
        fail("arguments after -- must come in pairs POINT RUN_DIR")
    by_point = {}
    for i in range(0, len(rest), 2):
        by_point.setdefault(rest[i], []).append(load(rest[i], rest[i + 1], a.steps))
    rows = []
    for reps in by_point.values():
        row = dict(reps[0])
        row["repeats"] = len(reps)
        row["runs"] = {}
        for k in FIGURES:
            vals = [r[k] for r in reps if r.get(k) is not None]
            row[k] = statistics.median(vals) if vals else None
            if vals:
                row["runs"][k] = benchlib.spread(vals)
        rows.append(row)
    for r in rows:
        peer = next((p for p in rows if p["fragments"] == 1 and p["overlap_steps"] == 0 and not p["delayed_update"]
                     and p["delay_ms"] == r["delay_ms"] and p["rate_mbit"] == r["rate_mbit"]), None)
        if peer is None:
            r["vs_blocking"] = None
            continue
        r["vs_blocking"] = {
            "steady_utilization": r["steady_utilization"] / peer["steady_utilization"],
            "run_utilization": r["run_utilization"] / peer["run_utilization"],
            "val_loss": (r["val_loss"] / peer["val_loss"]) if r["val_loss"] and peer["val_loss"] else None,
        }
    doc = {
        "benchmark": "overlap",
        "model": "configs/demo.yaml (GPT 4 x 128, 0.84M params), 2 sites x 1 rank",
        "steps": a.steps,
        "interval": a.interval,
        "peer": "blocking outer loop (fragments 1, overlap_steps 0) on the same emulated link",
        "points": rows,
    }
    doc.update(benchlib.load_record())
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Reads the warm-start benchmark's runs and prints one JSON document.

Arguments after `--` come in triples: NAME RUN_DIR WARM_STEPS (0 for sync and cold). Per run:
val_loss (summary.json), steps run, and vs_sync = val_loss / the sync run's; for warm runs
gap_closed = (cold - warm) / (cold - sync): 0 = no better than DiLoCo from scratch,
1 = as good as synchronous training.
"""
import argparse
import json
import sys


def fail(msg):
    print(f"summarize.py: {msg}", file=sys.stderr)
    sys.exit(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--warm-warmup", type=int, required=True)
    ap.add_argument("--nproc", type=int, required=True)
    ap.add_argument("--load-before", required=True)
    ap.add_argument("--load-after", required=True)
    ap.add_argument("runs", nargs="+")
    a = ap.parse_args()
    if len(a.runs) % 3:
        fail("runs come as NAME DIR WARM_STEPS triples")
    rows = {}
    for i in range(0, len(a.runs), 3):
        name, d, w = a.runs[i], a.runs[i + 1], int(a.runs[i + 2])
        try:
            with open(f"{d}/summary.json") as f:
                s = json.load(f)
        except (OSError, ValueError) as e:
            fail(f"{d}: {e}")
        want = a.steps - w
        if s.get("steps") != want or s.get("completed") is not True:
            fail(f"{d}: steps {s.get('steps')} completed {s.get('completed')}, expected {want} completed")
        if (w > 0) != bool(s.get("init_from")):
            fail(f"{d}: init_from is {s.get('init_from')!r}, expected {'a checkpoint' if w else 'none'}")
        rows[name] = {"warm_steps": w, "diloco_steps": 0 if name == "sync" else want,
                      "val_loss": s["val_loss"], "final_loss": s["final_loss"],
                      "wall_s": s["wall_s"], "outer_steps": s.get("outer_steps", 0)}
    if "sync" not in rows or "cold" not in rows:
        fail("needs the sync and cold runs")
    sync, cold = rows["sync"]["val_loss"], rows["cold"]["val_loss"]
    for r in rows.values():
        r["vs_sync"] = r["val_loss"] / sync
        if r["warm_steps"] > 0:
            r["gap_closed"] = (cold - r["val_loss"]) / (cold - sync) if cold != sync else None
    print(json.dumps({
        "bench": "warm_start",
        "model": "configs/demo.yaml (GPT 4x128, 0.84M params), 2 sites x 2 ranks, H 50, int8+EF+zstd",
        "steps": a.steps, "global_batch_sequences": 32, "warm_run_schedule_warmup_steps": a.warm_warmup,
        "peer": {"name": "synchronous data parallelism, same steps and tokens (configs/warm-start.yaml)",
                 "val_loss": sync},
        "runs": rows,
        "machine": {"nproc": a.nproc, "load_before": a.load_before, "load_after": a.load_after},
    }, indent=2))


if __name__ == "__main__":
    main()

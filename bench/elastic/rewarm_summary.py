#!/usr/bin/python3
"""Reads the re-warmup benchmark's runs (rewarm.sh) and prints one JSON document.

Arguments after `--` come in triples: WARMUP SEED RUN_DIR. Per run, from the run's files:
  join_round, join_step  lyon's joined entry (sites/lyon/summary or the run's summary.json)
  first_pg_ratio         ||lyon's pseudo-gradient|| in its first round after the join over the
                         mean of the other contributors' in that round (sqrt(ref2) of each
                         site's rounds.r0.jsonl line)
  steady_pg_ratio        the same ratio, averaged over lyon's rounds before it was killed
  val_loss               the run's final validation loss
Per warmup: the mean, min, max and every seed's value of each figure; vs_peer = the mean over
the peer's (warmup 0) mean.
"""
import argparse
import json
import math
import statistics
import sys

SITES = ("paris", "lyon", "milan")


from summary_io import fail, load_json, read_jsonl, set_prog

set_prog("rewarm_summary.py")


def rounds(d, site):
    """round number -> sqrt(ref2) of that site's own contribution, its members."""
    out = {}
    for _, j in read_jsonl(f"{d}/sites/{site}/rounds.r0.jsonl"):
        out[j["round"]] = (math.sqrt(j["ref2"]), j["members"], j.get("joiners", []))
    return out


def one_run(d, steps):
    s = load_json(f"{d}/summary.json")
    if s.get("steps") != steps or s.get("completed") is not True:
        fail(f"{d}: steps {s.get('steps')} completed {s.get('completed')}, expected {steps} completed")
    joined = None
    for r in s.get("ranks", []):
        if r.get("site") == "lyon":
            joined = (r.get("membership") or {}).get("joined")
    if not joined:
        fail(f"{d}: lyon did not join (no membership.joined in its summary)")
    by_site = {site: rounds(d, site) for site in SITES}
    jr = joined["round"]

    def ratio(rnd):
        mine = by_site["lyon"].get(rnd)
        others = [by_site[o][rnd][0] for o in ("paris", "milan") if rnd in by_site[o]]
        if not mine or not others or "lyon" not in mine[1]:
            return None
        return mine[0] / statistics.mean(others)

    after = sorted(r for r in by_site["lyon"] if r > jr and "lyon" in by_site["lyon"][r][1] and ratio(r))
    if not after:
        fail(f"{d}: no round after lyon's join (round {jr}) has its contribution")
    before = [x for x in (ratio(r) for r in sorted(by_site["lyon"]) if r < jr) if x]
    if not before:
        fail(f"{d}: no round of lyon's before its kill has a ratio")
    return {"join_round": jr, "join_step": joined["step"], "warmup_steps": joined.get("warmup_steps"),
            "first_pg_ratio": ratio(after[0]), "steady_pg_ratio": statistics.mean(before),
            "val_loss": s["val_loss"]}


def spread(xs):
    return {"mean": statistics.mean(xs), "stdev": statistics.stdev(xs) if len(xs) > 1 else 0.0,
            "min": min(xs), "max": max(xs), "all": xs}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--nproc", type=int, required=True)
    ap.add_argument("--load-before", required=True)
    ap.add_argument("--load-after", required=True)
    ap.add_argument("runs", nargs="+")
    a = ap.parse_args()
    if len(a.runs) % 3:
        fail("runs come as WARMUP SEED DIR triples")
    per = {}
    for i in range(0, len(a.runs), 3):
        w, seed, d = int(a.runs[i]), int(a.runs[i + 1]), a.runs[i + 2]
        r = one_run(d, a.steps)
        if r["warmup_steps"] != w:
            fail(f"{d}: the joiner says warmup_steps {r['warmup_steps']}, the run asked for {w}")
        per.setdefault(w, []).append(dict(r, seed=seed))
    if 0 not in per:
        fail("needs the peer: warmup 0")
    figures = ("first_pg_ratio", "steady_pg_ratio", "val_loss")
    rows = {}
    for w, rs in sorted(per.items()):
        rows[str(w)] = {f: spread([r[f] for r in rs]) for f in figures}
        rows[str(w)]["join_round"] = [r["join_round"] for r in rs]
        rows[str(w)]["seeds"] = [r["seed"] for r in rs]
    for w in rows:
        for f in figures:
            rows[w][f]["vs_peer"] = rows[w][f]["mean"] / rows["0"][f]["mean"]
    print(json.dumps({
        "benchmark": "elastic/rewarm",
        "config": "configs/elastic.yaml (3 sites x 1 rank, H 25), lyon SIGKILLed after outer step 3, rejoined",
        "steps": a.steps,
        "peer": "join_warmup_steps 0 (a fresh AdamW at the scheduled lr)",
        "by_warmup": rows,
        "load_before": [float(x) for x in a.load_before.split()],
        "load_after": [float(x) for x in a.load_after.split()],
        "nproc": a.nproc,
    }, indent=2))


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Reads the summary.json of each strategy-benchmark run and prints one JSON document.

Arguments after `--` come in fives: STRATEGY RANKS REPEAT SUMMARY_JSON LINK_BYTES (the bytes that
crossed the link between the two nodes, NODES=2; 0 otherwise); STRATEGY `hybridG` is hybrid with
group_size G. Every (strategy,
ranks) ran BENCH_RUNS times, alternating with the others (bench/lib.sh); times are the median
over the repeats with min and max, the other figures come from the median run (bytes and
memory are deterministic). Figures per (strategy, ranks):

  step_time_s                   median wall_s / steps of global rank 0 (includes start-up, the
                                final evaluation and checkpoint, amortized over the steps);
                                step_time_runs_s: median, min, max and every repeat
  bytes_moved_per_step_per_rank bytes each rank sent over the site's collectives per step
                                (summary `site_bytes_per_step`), mean and max over ranks
  ring_model_bytes_per_step     what ring collectives should send per rank and step:
                                k (n-1)/n * 4 * params, with k = 2 (ddp: all-reduce),
                                3 (zero1: all-reduce + all-gather), 2 (zero2: reduce-scatter +
                                all-gather), 2 (fsdp: all-gather + reduce-scatter); hybrid with
                                groups of G over R = n/G: 2 (G-1)/G inside the group plus
                                2 (R-1)/R / G over the replica set
  cross_group_bytes_per_step    hybrid: what each rank sent outside its group (summary)
  node_link_bytes_per_step      NODES=2: bytes on the link between the nodes per step (both
                                directions, veth counters: payload plus TCP/IP headers)
  memory_per_rank               the trainer's accounting per rank; persistent_bytes = params +
                                grads + grad shard + AdamW moments held between steps;
                                peak_transient_bytes = buffers that live only during a step
  vs_ddp                        ratios to ddp with the same rank count (the named peer)
"""
import argparse
import json
import statistics
import sys

import benchlib

RING_FACTOR = {"ddp": 2, "zero1": 3, "zero2": 2, "fsdp": 2}


def kind_of(token):
    """("hybrid", G) for hybridG, (token, 0) otherwise."""
    if token.startswith("hybrid") and token[6:].isdigit():
        return "hybrid", int(token[6:])
    return token, 0


def ring_factor(token, ranks):
    kind, g = kind_of(token)
    if kind != "hybrid":
        return RING_FACTOR[kind] * (ranks - 1) / ranks
    r = ranks // g
    return 2 * (g - 1) / g + 2 * (r - 1) / r / g
MEMORY_KEYS = ("param_bytes", "grad_bytes", "grad_shard_bytes", "optimizer_bytes", "peak_transient_bytes")


def fail(msg):
    print(f"summarize.py: {msg}", file=sys.stderr)
    sys.exit(1)


def load(path, token, ranks, steps):
    strategy = kind_of(token)[0]
    try:
        with open(path) as f:
            s = json.load(f)
    except (OSError, ValueError) as e:
        fail(f"{path}: {e}")
    if s.get("steps") != steps or s.get("completed") is not True:
        fail(f"{path}: steps {s.get('steps')} completed {s.get('completed')}, expected {steps} completed")
    if s.get("world_size") != ranks:
        fail(f"{path}: world_size {s.get('world_size')}, expected {ranks}")
    per_rank = s.get("ranks") if ranks > 1 else [s]
    if not isinstance(per_rank, list) or len(per_rank) != ranks:
        fail(f"{path}: expected {ranks} per-rank summaries")
    for r in per_rank:
        if r.get("memory", {}).get("strategy") != strategy:
            fail(f"{path}: rank {r.get('rank')} ran strategy {r.get('memory', {}).get('strategy')}, expected {strategy}")
    return s, per_rank


def figures(s, per_rank, strategy, ranks, steps, crossed):
    params = s["params"]
    moved = [float(r.get("site_bytes_per_step", 0)) for r in per_rank]
    memory = []
    for r in per_rank:
        m = r["memory"]
        row = {"rank": r.get("rank", 0)}
        row.update({k: int(m[k]) for k in MEMORY_KEYS})
        row["persistent_bytes"] = row["param_bytes"] + row["grad_bytes"] + row["grad_shard_bytes"] + row["optimizer_bytes"]
        memory.append(row)
    coll = per_rank[0].get("site_collectives", {})
    by_kind = {k: v["bytes_sent"] / steps for k, v in coll.items() if isinstance(v, dict) and v.get("calls", 0) > 0}
    ring = ring_factor(strategy, ranks) * 4 * params
    cross = [float(r["cross_group_bytes_per_step"]) for r in per_rank if "cross_group_bytes_per_step" in r]
    return {
        "strategy": strategy,
        "ranks": ranks,
        "params": params,
        "steps": steps,
        "wall_s": s["wall_s"],
        "step_time_s": s["wall_s"] / steps,
        "tokens_per_s": s["tokens_per_s"],
        "bytes_moved_per_step_per_rank": {"mean": sum(moved) / len(moved), "max": max(moved), "by_rank": moved},
        "rank0_bytes_per_step_by_collective": by_kind,
        "ring_model_bytes_per_step": ring,
        "measured_over_ring_model": (sum(moved) / len(moved)) / ring if ring else None,
        "cross_group_bytes_per_step": (sum(cross) / len(cross)) if cross else None,
        "node_link_bytes_per_step": crossed / steps if crossed else None,
        "memory_per_rank": memory,
        "persistent_bytes_max": max(m["persistent_bytes"] for m in memory),
        "peak_transient_bytes_max": max(m["peak_transient_bytes"] for m in memory),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--nodes", type=int, default=1)
    ap.add_argument("--link", default="")
    ap.add_argument("runs", nargs="*")
    a = ap.parse_args()
    if len(a.runs) % 5 != 0 or not a.runs:
        fail("expected STRATEGY RANKS REPEAT SUMMARY_JSON LINK_BYTES quintuples")

    repeats = {}
    for i in range(0, len(a.runs), 5):
        strategy, ranks, path, crossed = a.runs[i], int(a.runs[i + 1]), a.runs[i + 3], int(a.runs[i + 4])
        repeats.setdefault((strategy, ranks), []).append(load(path, strategy, ranks, a.steps) + (crossed,))

    results = []
    for (strategy, ranks), runs in repeats.items():
        walls = [s["wall_s"] for s, _, _ in runs]
        s, pr, crossed = sorted(runs, key=lambda r: r[0]["wall_s"])[(len(runs) - 1) // 2]  # the (lower) median run
        r = figures(s, pr, strategy, ranks, a.steps, crossed)
        r["step_time_s"] = statistics.median(walls) / a.steps
        r["step_time_runs_s"] = benchlib.spread([w / a.steps for w in walls])
        r["tokens_per_s"] = statistics.median(x["tokens_per_s"] for x, _, _ in runs)
        if a.nodes == 2:
            r["node_link_bytes_per_step_runs"] = benchlib.spread([c / a.steps for _, _, c in runs])
        results.append(r)
    peers = {r["ranks"]: r for r in results if r["strategy"] == "ddp"}
    for r in results:
        p = peers.get(r["ranks"])
        if p is None:
            r["vs_ddp"] = None
            continue
        r["vs_ddp"] = {
            "step_time_ratio": r["step_time_s"] / p["step_time_s"],
            "bytes_moved_ratio": (r["bytes_moved_per_step_per_rank"]["mean"] / p["bytes_moved_per_step_per_rank"]["mean"])
            if p["bytes_moved_per_step_per_rank"]["mean"] else None,
            "persistent_memory_ratio": r["persistent_bytes_max"] / p["persistent_bytes_max"],
            "peak_transient_ratio": r["peak_transient_bytes_max"] / p["peak_transient_bytes_max"],
        }
        if r["node_link_bytes_per_step"] and p["node_link_bytes_per_step"]:
            r["vs_ddp"]["node_link_bytes_ratio"] = r["node_link_bytes_per_step"] / p["node_link_bytes_per_step"]
    doc = {
        "bench": "strategies",
        "what": "intra-site strategies on CPU (Gloo over loopback), one site, 1 thread per rank"
        if a.nodes == 1 else
        f"intra-site strategies on CPU, one site over 2 nodes (namespaces) joined by one link of {a.link}, "
        "Gloo over the nodes' addresses, 1 thread per rank",
        "peer": "ddp with the same rank count",
        "results": results,
    }
    doc.update(benchlib.load_record())
    json.dump(doc, sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Reads the churn soak's two runs (churn.sh) and prints one JSON document.

Each run comes as --baseline/--churn DIR RC WALL_S LOG. Checked on both (exit 1, naming the
run, the file and what broke):
  1. hashes agree: all lines of one (round, fragment) in every sites/<site>/rounds.r<rank>.jsonl
     carry the same global_hash (site-wide: every rank of a site logs the combined hash),
     members, joiners, step and tokens; the site writing a line is one of its members, and a
     round has at least min_sites members;
  2. forward only: in every rounds file (a restarted site appends to its file) rounds and steps
     strictly increase; the rounds committed are exactly 1..N, N = steps / outer_interval, the
     steps of round r are r x outer_interval;
  3. tokens add up, per rank summary (sites/<site>/rank<r>.json, the rank's last life):
     committed = committed_by_site[site], not_committed = trained - committed >= 0, trained =
     (steps - the step it joined at, or 0) x the site's tokens a step (the baseline's trained /
     steps), committed_by_site[s] = the sum of s's tokens over the rounds this rank applied
     after counted_after_round, and it applied every round after that one (one fragment: a
     round counts fully);
  4. the run finished: the launch exited 0, summary.json and every rank summary say completed
     with all the steps, the last round and summary.json have every site as a member, and every
     rank summary and the last round carry one global-weights hash.
Reported per run: wall_s, rounds committed, evictions (a member of round r-1 that is not one of
round r) and joins (the rounds' joiners; bytes and seconds from the joiners' "joined at" log
lines), restarts (launcher log), "the partition healed" warnings (log; no link is cut in this
soak, so each is a false alarm), compute utilization over the 8 rank summaries (mean, min),
committed_token_fraction (tokens in committed rounds over steps x sites x tokens a step), final
val loss. vs_peer: churn over baseline for wall_s and utilization.
"""
import argparse
import json
import re
import statistics
import sys


from summary_io import fail, load_json, read_jsonl, set_prog

set_prog("churn_summary.py")
read_lines = read_jsonl


JOINED = re.compile(r"\] info site (\S+): joined at outer round (\d+) \(inner step (\d+)\) from (.*?): "
                    r"(\d+) bytes in ([0-9.]+) s")
RESTART = re.compile(r"^\[launch\] site (\S+): restart (\d+) of \d+: starting")


def one_run(name, d, rc, wall, log, steps, tokens_per_step):
    """Checks one run's invariants; returns its figures."""
    where = f"{name} run ({d})"
    if rc != 0:
        fail(f"{where}: the launch exited {rc}, not 0 (its log: {log})")
    s = load_json(f"{d}/summary.json")
    if s.get("completed") is not True or s.get("steps") != steps:
        fail(f"{where}: summary.json says completed {s.get('completed')} after {s.get('steps')} steps, "
             f"expected completed after {steps}")
    if s.get("outer_fragments") != 1 or s.get("outer_overlap_steps"):
        fail(f"{where}: the checks assume one fragment and blocking syncs (outer_fragments "
             f"{s.get('outer_fragments')}, overlap {s.get('outer_overlap_steps')})")
    interval = s["outer_interval"]
    mem = s.get("membership") or {}
    min_sites = mem.get("min_sites", 1)
    sites = sorted({r["site"] for r in s["ranks"]}, key=[r["site"] for r in s["ranks"]].index)
    nranks = s["memory"]["ranks"]
    if len(s["ranks"]) != len(sites) * nranks:
        fail(f"{where}: summary.json has {len(s['ranks'])} ranks, expected {len(sites)} sites x {nranks}")

    # 1. and 2.: every rounds file, one table of the committed rounds.
    table = {}  # (round, fragment) -> (line's agreed fields, "file:line" that set it)
    applied = {}  # (site, rank) -> [round, ...] in file order
    for site in sites:
        for rank in range(nranks):
            path = f"{d}/sites/{site}/rounds.r{rank}.jsonl"
            last = None
            rounds = []
            for n, j in read_lines(path):
                key = (j["round"], j["fragment"])
                here = f"{path}:{n}"
                if last is not None and (j["round"] <= last["round"] or j["step"] <= last["step"]):
                    fail(f"{where}: rounds went backwards in {here}: round {j['round']} (step {j['step']}) after "
                         f"round {last['round']} (step {last['step']})")
                last = j
                rounds.append(j["round"])
                if site not in j["members"]:
                    fail(f"{where}: {here}: site {site} applied round {j['round']} without being one of its "
                         f"members {j['members']}")
                if len(j["members"]) < min_sites:
                    fail(f"{where}: {here}: round {j['round']} committed with {len(j['members'])} members, "
                         f"below min_sites {min_sites}")
                agreed = {k: j[k] for k in ("global_hash", "members", "joiners", "step", "tokens")}
                if key not in table:
                    table[key] = (agreed, here)
                    continue
                first, there = table[key]
                for k in agreed:
                    if agreed[k] != first[k]:
                        what = "hash" if k == "global_hash" else k
                        fail(f"{where}: round {j['round']} fragment {j['fragment']}: the members disagree on its "
                             f"{what}: {first[k]} in {there}, {agreed[k]} in {here}")
            applied[(site, rank)] = rounds
    committed = sorted(r for r, _ in table)
    n_rounds = steps // interval
    if committed != list(range(1, n_rounds + 1)):
        missing = sorted(set(range(1, n_rounds + 1)) - set(committed))
        extra = sorted(set(committed) - set(range(1, n_rounds + 1)))
        fail(f"{where}: the committed rounds are not exactly 1..{n_rounds} (steps / interval): missing {missing}, "
             f"unexpected {extra}")
    rounds = {r: table[(r, 0)][0] for r in committed}
    for r, j in rounds.items():
        if j["step"] != r * interval:
            fail(f"{where}: round {r} committed at step {j['step']}, expected {r * interval} ({table[(r, 0)][1]})")

    # 3. and 4.: every rank's summary.
    hashes = {}
    utils = []
    joined_at = {}
    for site in sites:
        for rank in range(nranks):
            path = f"{d}/sites/{site}/rank{rank}.json"
            rs = load_json(path)
            if rs.get("completed") is not True or rs.get("steps") != steps:
                fail(f"{where}: {path} says completed {rs.get('completed')} after {rs.get('steps')} steps, "
                     f"expected completed after {steps}")
            hashes[f"{site}/{rank}"] = rs.get("global_weights_hash")
            utils.append(rs["compute_utilization"])
            m = rs.get("membership") or {}
            t = m.get("tokens")
            if not t:
                fail(f"{where}: {path} has no membership.tokens")
            joined = m.get("joined")
            start = joined["step"] if joined else 0
            if joined:
                joined_at[site] = joined
            if t["site"] != site:
                fail(f"{where}: {path}: membership.tokens.site is {t['site']}")
            if t["committed"] != t["committed_by_site"].get(site):
                fail(f"{where}: {path}: tokens committed {t['committed']} but committed_by_site[{site}] "
                     f"{t['committed_by_site'].get(site)}")
            if t["not_committed"] != t["trained"] - t["committed"] or t["not_committed"] < 0:
                fail(f"{where}: {path}: tokens not_committed {t['not_committed']}, trained {t['trained']}, "
                     f"committed {t['committed']}: not_committed must be trained - committed >= 0")
            if tokens_per_step is not None and t["trained"] != (steps - start) * tokens_per_step:
                fail(f"{where}: {path}: tokens trained {t['trained']}, expected (steps {steps} - joined at step "
                     f"{start}) x {tokens_per_step} tokens a step = {(steps - start) * tokens_per_step}")
            after = t["counted_after_round"]
            if joined and after != joined["round"]:
                fail(f"{where}: {path}: tokens counted after round {after}, but it joined at round "
                     f"{joined['round']}")
            mine = [r for r in applied[(site, rank)] if r > after]
            if mine != list(range(after + 1, n_rounds + 1)):
                fail(f"{where}: {path}: after round {after} it applied rounds {mine[:5]}...{mine[-5:]} of its "
                     f"rounds file, not every round {after + 1}..{n_rounds}")
            for i, other in enumerate(sites):
                want = sum(rounds[r]["tokens"][i] for r in mine)
                got = t["committed_by_site"].get(other, 0)
                if got != want:
                    fail(f"{where}: {path}: committed_by_site[{other}] is {got}, but {other}'s tokens in the rounds "
                         f"after {after} add up to {want}")
    last = rounds[n_rounds]
    if set(last["members"]) != set(sites) or set(mem.get("members", [])) != set(sites):
        fail(f"{where}: not every site is a member at the end: last round {n_rounds} has {last['members']}, "
             f"summary.json {mem.get('members')}")
    if len(set(hashes.values())) != 1 or last["global_hash"] not in hashes.values():
        fail(f"{where}: the ranks end on different global-weights hashes: {hashes} (last round's "
             f"{last['global_hash']})")

    # Figures.
    evictions = []
    for r in committed[1:]:
        for site in rounds[r - 1]["members"]:
            if site not in rounds[r]["members"]:
                evictions.append({"round": r, "site": site})
    log_joins = {}
    restarts = {}
    heals = []
    try:
        with open(log, errors="replace") as f:
            for line in f:
                m = JOINED.search(line)
                if m:
                    log_joins[(m.group(1), int(m.group(2)))] = {
                        "step": int(m.group(3)), "donors": m.group(4), "bytes": int(m.group(5)),
                        "seconds": float(m.group(6))}
                m = RESTART.search(line)
                if m:
                    restarts[m.group(1)] = restarts.get(m.group(1), 0) + 1
                if "the partition healed" in line:
                    heals.append(line.strip())
    except OSError as e:
        fail(f"{log}: {e}")
    joins = []
    for r in committed:
        for site in rounds[r]["joiners"]:
            joins.append(dict({"round": r, "site": site}, **log_joins.get((site, r), {})))
    secs = [j["seconds"] for j in joins if "seconds" in j]
    ideal = steps * len(sites) * tokens_per_step if tokens_per_step else None
    in_rounds = sum(sum(j["tokens"]) for j in rounds.values())
    return {
        "wall_s": wall,
        "rounds_committed": len(committed),
        "members_per_round": {"mean": statistics.mean(len(j["members"]) for j in rounds.values()),
                              "min": min(len(j["members"]) for j in rounds.values())},
        "evictions": {"count": len(evictions), "list": evictions},
        "joins": {"count": len(joins), "seconds_mean": statistics.mean(secs) if secs else None,
                  "seconds_max": max(secs) if secs else None, "list": joins},
        "restarts": {"count": sum(restarts.values()), "by_site": restarts},
        # No link is ever cut here: each is a site that took a stale split status for a partition.
        "partition_healed_warnings": heals,
        "compute_utilization": {"mean": statistics.mean(utils), "min": min(utils), "ranks": len(utils),
                                "run_summary": s["compute_utilization"]},
        "tokens_in_committed_rounds": in_rounds,
        "committed_token_fraction": in_rounds / ideal if ideal else None,
        "val_loss": s["val_loss"],
        "global_weights_hash": last["global_hash"],
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--nproc", type=int, required=True)
    ap.add_argument("--load-before", required=True)
    ap.add_argument("--load-after", required=True)
    ap.add_argument("--kills", required=True, help="TSV: seconds, inner step, site, site|rankR, pids, rejoin seconds")
    ap.add_argument("--kill-window", nargs=3, type=float, metavar=("MIN_S", "MAX_S", "STOP_STEP"))
    ap.add_argument("--baseline", nargs=4, required=True, metavar=("DIR", "RC", "WALL_S", "LOG"))
    ap.add_argument("--churn", nargs=4, required=True, metavar=("DIR", "RC", "WALL_S", "LOG"))
    a = ap.parse_args()

    # The site's tokens a step, from the baseline (no joins: trained = steps x tokens a step).
    b0 = load_json(f"{a.baseline[0]}/summary.json")["ranks"][0]["membership"]["tokens"]
    if b0["trained"] % a.steps:
        fail(f"baseline: trained {b0['trained']} tokens is not a multiple of {a.steps} steps")
    per_step = b0["trained"] // a.steps

    runs = {}
    for name, (d, rc, wall, log) in (("baseline", a.baseline), ("churn", a.churn)):
        runs[name] = one_run(name, d, int(rc), float(wall), log, a.steps, per_step)

    kills = []
    try:
        with open(a.kills) as f:
            for line in f:
                t, step, site, what, pids, rejoin = (line.rstrip("\n").split("\t") + [""] * 6)[:6]
                kills.append({"t_s": float(t), "step": int(step), "site": site, "what": what,
                              "pids": [int(p) for p in pids.split()] if pids not in ("", "none") else [],
                              "rejoined_after_s": float(rejoin) if rejoin else None})
    except (OSError, ValueError) as e:
        fail(f"{a.kills}: {e}")
    done = [k for k in kills if k["pids"]]
    if any(k["rejoined_after_s"] is None for k in done):
        fail(f"churn run: a killed site did not rejoin: {[k for k in done if k['rejoined_after_s'] is None]}")

    b, c = runs["baseline"], runs["churn"]
    print(json.dumps({
        "benchmark": "elastic/churn",
        "config": "configs/elastic-churn.yaml (4 sites x 2 ranks, H 25, min_sites 2, deadline 20 s); "
                  "churn: seeded SIGKILLs of whole sites and single ranks, restarted by geoloco launch with --join",
        "steps": a.steps,
        "seed": a.seed,
        "peer": "the same run without kills (baseline)",
        "kill_window": dict(zip(("min_s", "max_s", "last_before_step"), a.kill_window)) if a.kill_window else None,
        "kills": {"count": len(done), "whole_site": sum(k["what"] == "site" for k in done),
                  "single_rank": sum(k["what"] != "site" for k in done),
                  "rejoin_s_mean": statistics.mean(k["rejoined_after_s"] for k in done) if done else None,
                  "list": kills},
        "invariants": "held: round hashes agree, rounds move forward, tokens add up, the run finished",
        "soak_at_least_600_s": c["wall_s"] >= 600,
        "churn": c,
        "baseline": b,
        "vs_peer": {"wall_s": c["wall_s"] / b["wall_s"],
                    "compute_utilization_mean": c["compute_utilization"]["mean"] / b["compute_utilization"]["mean"],
                    "compute_utilization_min": c["compute_utilization"]["min"] / b["compute_utilization"]["min"],
                    "committed_token_fraction": (c["committed_token_fraction"] / b["committed_token_fraction"]
                                                 if b["committed_token_fraction"] else None),
                    "val_loss": c["val_loss"] / b["val_loss"]},
        "load_before": [float(x) for x in a.load_before.split()],
        "load_after": [float(x) for x in a.load_after.split()],
        "nproc": a.nproc,
    }, indent=2))


if __name__ == "__main__":
    main()

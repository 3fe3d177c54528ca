#!/usr/bin/python3
"""Reads the budget-benchmark runs, asks `geoloco budget` for each point's prediction and
prints one JSON document: predicted vs measured fragment sync time and compute utilization.

Arguments: --calibration F:tau DIR (one per schedule: a run without emulation) and
--point F:tau:delay_ms:rate_mbit DIR (one per emulated link and schedule).

Measured, per run (both sites' summaries, metrics.jsonl and traces):
  fragment_sync_s      median over the steady rounds of the per-round minimum over the two
                       sites of summary sync_seconds. A blocking sync (or an overlapped
                       worker) starts when its site reaches the sync step; the site that
                       arrives first also waits for the other site's compute (site skew), the
                       last one pays the sync alone. The minimum is that last site's figure.
  fragment_sync_sites_mean_s   the same rounds averaged over the sites: skew included.
  steady rounds        all but the first round of each fragment (zstd and UCX warm up:
                       +50..150 ms) and, for an overlapped schedule, the last F rounds (the
                       end-of-run syncs, which block)
  utilization          per site sum(period_compute_s) / sum(period_wall_s) over the outer
                       periods of metrics.jsonl but the first (start-up, warm-up sync) and,
                       overlapped, the last (end-of-run blocking syncs); mean of the sites
  step_time_s          median inner step (forward start to optimizer end, trace) over the
                       steps before the run's first sync, the first step excluded; the slower
                       site's. This is an input of the prediction (as outer.plan: auto
                       measures it), not a result.

Inputs of the prediction (budget YAML written next to each run, budget.yaml):
  link                 rtt = 2 x delay_ms, rate and per-connection rate = rate_mbit (the
                       emulator paces each peer pair; it has no TCP window), rtts_per_round
                       0.5 (the emulator delays the data one way; UCX's rendezvous runs on
                       loopback), check_rtts 0 (the weight-hash check is verified a round
                       later, off the sync path; runs before 2026-12-01 waited for it: 0.5)
  compression          bytes_per_value = the calibration run's wire bytes per period / params
  schedule             H, F, tau; step_time_s as above; local_sync_s = F x the calibration
                       run's measured fragment sync (same schedule, no emulation)
Ratios are measured / predicted (the peer is the prediction). model_before: the same inputs
through the model as it was before this benchmark (1.5 RTT per round for UCX's rendezvous on
a TCP path, no hash check, no local work), to show what each term is worth.
"""
import argparse
import json
import statistics
import subprocess
import sys

import benchlib


def fail(msg):
    print(f"summarize.py: {msg}", file=sys.stderr)
    sys.exit(1)


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        fail(f"{path}: {e}")


def read_periods(path):
    out = []
    try:
        with open(path) as f:
            for line in f:
                j = json.loads(line)
                if "period_wall_s" in j:
                    out.append(j)
    except (OSError, ValueError) as e:
        fail(f"{path}: {e}")
    return out


def pre_sync_step_time(trace_path):
    """Median inner step before the first sync (first step excluded), from a rank's trace."""
    events = read_json(trace_path).get("events", [])
    spans = [e for e in events if e.get("ph") == "X"]
    first_sync = min((e["ts"] for e in spans if e["name"] == "compress"), default=None)
    if first_sync is None:
        fail(f"{trace_path}: no sync in the trace")
    main = sorted((e for e in spans if e.get("tid") == 0 and e["name"] in ("forward", "optimizer")),
                  key=lambda e: e["ts"])
    steps, start = [], None
    for e in main:
        if e["name"] == "forward" and start is None:
            start = e["ts"]
        elif e["name"] == "optimizer" and start is not None:
            end = e["ts"] + e["dur"]
            if end <= first_sync:
                steps.append((end - start) / 1e6)
            start = None
    if len(steps) < 3:
        fail(f"{trace_path}: only {len(steps)} inner steps before the first sync")
    return statistics.median(steps[1:])


def load_run(d, steps, F, tau):
    s = read_json(f"{d}/summary.json")
    ranks = s.get("ranks", [])
    if len(ranks) != 2:
        fail(f"{d}: expected 2 ranks (2 sites x 1 rank), found {len(ranks)}")
    for r in ranks:
        if r.get("steps") != steps or r.get("completed") is not True:
            fail(f"{d}: {r.get('site')}: steps {r.get('steps')} completed {r.get('completed')}, expected {steps}")
        if r.get("outer_fragments") != F or r.get("outer_overlap_steps") != tau:
            fail(f"{d}: {r.get('site')}: ran F {r.get('outer_fragments')} tau {r.get('outer_overlap_steps')}, "
                 f"expected F {F} tau {tau}")
    overlapped = tau > 0
    syncs = [r["sync_seconds"] for r in ranks]
    if len(syncs[0]) != len(syncs[1]):
        fail(f"{d}: the sites completed {len(syncs[0])} and {len(syncs[1])} rounds")
    rounds = list(zip(*syncs))
    steady = rounds[F:len(rounds) - F] if overlapped else rounds[F:]
    if len(steady) < 2:
        fail(f"{d}: fewer than 2 steady rounds ({len(rounds)} in all); raise STEPS")
    mins = [min(r) for r in steady]
    means = [sum(r) / len(r) for r in steady]

    utils, exposed, covered, step_times = [], 0.0, 0, []
    for r in ranks:
        site = r["site"]
        periods = read_periods(f"{d}/sites/{site}/metrics.jsonl")
        keep = periods[1:len(periods) - 1] if overlapped else periods[1:]
        if not keep:
            fail(f"{d}: {site}: no steady outer period (of {len(periods)})")
        utils.append(sum(p["period_compute_s"] for p in keep) / sum(p["period_wall_s"] for p in keep))
        exposed += sum(p["exposed_wait_s"] for p in keep) / len(ranks)
        covered = keep[-1]["step"] - periods[0]["step"]
        step_times.append(pre_sync_step_time(f"{d}/sites/{site}/trace.r0.json"))
    wire = statistics.mean(r["wire_bytes_per_outer_step"] for r in ranks)
    return {
        "params": s["params"],
        "sites": [r["site"] for r in ranks],
        "bytes_per_value": wire / s["params"],
        "step_time_s": max(step_times),
        "step_time_sites_s": step_times,
        "rounds": len(rounds),
        "steady_rounds_min_over_sites_s": mins,
        "fragment_sync_s": statistics.median(mins),
        "fragment_sync_sites_mean_s": statistics.median(means),
        "site_skew_s": statistics.median(m - n for m, n in zip(means, mins)),
        "utilization": statistics.mean(utils),
        "utilization_sites": utils,
        "exposed_per_period_s": exposed * (int(ranks[0]["outer_interval"]) / covered) if covered > 0 else None,
        "wall_s": max(r["wall_s"] for r in ranks),
    }


def budget_yaml(params, bpv, delay_ms, rate_mbit, step_s, H, F, tau, local_sync_s, rtts_per_round=0.5, check_rtts=0.0):
    gbps = rate_mbit / 1000.0
    return (
        "format: geoloco-budget\nversion: 1\n"
        f"model: {{params: {params}}}\n"
        f"compression: {{bytes_per_value: {bpv!r}}}\n"
        "sites: 2\n"
        f"link: {{rtt_ms: {2 * delay_ms!r}, rate_gbps: {gbps!r}, rtts_per_round: {rtts_per_round!r}, "
        f"check_rtts: {check_rtts!r}}}\n"
        f"measured: {{per_connection_gbps: {gbps!r}}}\n"
        f"schedule: {{step_time_s: {step_s!r}, H: {H}, fragments: {F}, overlap_steps: {tau}, ranks: 1, lanes: 1, "
        f"local_sync_s: {local_sync_s!r}}}\n")


def predict(geoloco, path, text):
    with open(path, "w") as f:
        f.write(text)
    p = subprocess.run([geoloco, "budget", "--from", path, "--json"], capture_output=True, text=True)
    if p.returncode != 0:
        fail(f"geoloco budget --from {path}: {p.stderr.strip()}")
    try:
        return json.loads(p.stdout)["current"]
    except (ValueError, KeyError) as e:
        fail(f"geoloco budget --from {path}: unreadable JSON ({e})")


def load_pair(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--geoloco", required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--cal-steps", type=int, required=True)
    ap.add_argument("--interval", type=int, required=True)
    ap.add_argument("--nproc", type=int, required=True)
    ap.add_argument("--load-before", required=True)
    ap.add_argument("--load-after", required=True)
    ap.add_argument("--calibration", nargs=2, action="append", default=[], metavar=("F:TAU", "DIR"))
    ap.add_argument("--point", nargs=2, action="append", default=[], metavar=("F:TAU:DELAY:RATE", "DIR"))
    a = ap.parse_args()
    H = a.interval

    cals = {}
    for key, d in a.calibration:
        try:
            F, tau = (int(x) for x in key.split(":"))
        except ValueError:
            fail(f"bad calibration key {key!r}")
        m = load_run(d, a.cal_steps, F, tau)
        cals[(F, tau)] = {
            "fragments": F, "overlap_steps": tau,
            "fragment_local_s": m["fragment_sync_s"],
            "local_sync_s": F * m["fragment_sync_s"],
            "bytes_per_value": m["bytes_per_value"],
            "step_time_s": m["step_time_s"],
            "steady_rounds_min_over_sites_s": m["steady_rounds_min_over_sites_s"],
            "utilization": m["utilization"],
            "loadavg_before": load_pair(f"{d}.load_before"),
            "loadavg_after": load_pair(f"{d}.load_after"),
        }

    rows = []
    for key, d in a.point:
        try:
            F, tau, delay, rate = key.split(":")
            F, tau, delay, rate = int(F), int(tau), float(delay), float(rate)
        except ValueError:
            fail(f"bad point key {key!r}")
        cal = cals.get((F, tau))
        if cal is None:
            fail(f"point {key}: no calibration run for F {F} tau {tau}")
        m = load_run(d, a.steps, F, tau)
        pred = predict(a.geoloco, f"{d}/budget.yaml",
                       budget_yaml(m["params"], cal["bytes_per_value"], delay, rate, m["step_time_s"], H, F, tau,
                                   cal["local_sync_s"]))
        # The model as it stood before this benchmark (1.5 RTT rendezvous per round, no hash
        # check, no local work), fed the same link: what the terms above correct.
        before = predict(a.geoloco, f"{d}/budget_before.yaml",
                         budget_yaml(m["params"], cal["bytes_per_value"], delay, rate, m["step_time_s"], H, F, tau,
                                     0.0, rtts_per_round=1.5, check_rtts=0.0))
        fs = pred["fragment_sync"]
        ratio_sync = m["fragment_sync_s"] / fs["total_s"]
        ratio_util = m["utilization"] / pred["utilization"]
        rows.append({
            "delay_ms": delay, "rate_mbit": rate, "fragments": F, "overlap_steps": tau, "H": H,
            "inputs": {
                "rtt_s": 2 * delay / 1e3, "rate_bytes_per_s": rate * 1e6 / 8,
                "bytes_per_value": cal["bytes_per_value"], "local_sync_s": cal["local_sync_s"],
                "step_time_s": m["step_time_s"], "step_time_sites_s": m["step_time_sites_s"],
            },
            "predicted": {
                "fragment_sync_s": fs["total_s"],
                "bandwidth_s": fs["bandwidth_s"],
                "latency_s": fs["latency_s"],
                "check_s": fs["check_s"],
                "local_s": fs["local_s"],
                "hide_window_s": pred["hide_window_s"],
                "exposed_per_period_s": pred["exposed_s"],
                "utilization": pred["utilization"],
            },
            "measured": {k: m[k] for k in ("fragment_sync_s", "fragment_sync_sites_mean_s", "site_skew_s",
                                           "steady_rounds_min_over_sites_s", "rounds", "utilization",
                                           "utilization_sites", "exposed_per_period_s", "wall_s")},
            "ratio": {"fragment_sync": ratio_sync, "utilization": ratio_util},
            "model_before": {
                "fragment_sync_s": before["fragment_sync"]["total_s"],
                "utilization": before["utilization"],
                "ratio_fragment_sync": m["fragment_sync_s"] / before["fragment_sync"]["total_s"],
            },
            "within_20pct": abs(ratio_sync - 1) <= 0.2 and abs(ratio_util - 1) <= 0.2,
            "loadavg_before": load_pair(f"{d}.load_before"),
            "loadavg_after": load_pair(f"{d}.load_after"),
        })

    def worst(metric):
        return max((abs(r["ratio"][metric] - 1) for r in rows), default=None)

    doc = {
        "benchmark": "budget",
        "model": "configs/demo.yaml (GPT 4 x 128, 0.84M params, int8/b128 + error feedback + zstd 3), 2 sites x 1 rank",
        "steps": a.steps,
        "calibration_steps": a.cal_steps,
        "interval": H,
        "peer": "the budget model's prediction (geoloco budget --json, tools/planner/budget.cpp) from the emulated "
                "link's nominal delay and rate, the calibration run's local sync time and bytes per value, and the "
                "step time measured before the first sync",
        "target": "measured / predicted within [0.8, 1.2]",
        "machine": {"nproc": a.nproc, "loadavg_before": a.load_before, "loadavg_after": a.load_after},
        "calibration": list(cals.values()),
        "points": rows,
        "summary": {
            "points": len(rows),
            "within_20pct": sum(1 for r in rows if r["within_20pct"]),
            "worst_abs_error_fragment_sync": worst("fragment_sync"),
            "worst_abs_error_utilization": worst("utilization"),
        },
    }
    doc.update(benchlib.load_record(runs=1))  # bench/lib.sh's load gate; one run per point
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()

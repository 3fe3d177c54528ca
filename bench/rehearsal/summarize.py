"""bench/rehearsal/summarize.py OUT SCENARIO...: the JSON of bench/rehearsal/run.sh."""
import glob
import json
import os
import statistics
import sys

import benchlib

out, scenarios = sys.argv[1], sys.argv[2:]
result = {}
worst = None
for sc in scenarios:
    runs = []
    for d in sorted(glob.glob(os.path.join(out, sc + "-*"))):
        if not os.path.isdir(d):
            continue
        s = json.load(open(os.path.join(d, "summary.json")))
        reh = s["rehearsal"]
        syncs = s["sync_seconds"]
        util = []
        for line in open(os.path.join(d, "metrics.jsonl")):
            m = json.loads(line)
            # Whole periods after the first sync: the last line (the run's end, a partial period
            # with the final blocking sync) is left out.
            if "compute_utilization" in m and m.get("outer_step", 0) >= 2 and m["step"] < s["steps"]:
                util.append(m["compute_utilization"])
        plan = s["plans"][-1]
        runs.append({
            "predicted_utilization": reh["predicted"]["compute_utilization"],
            "predicted_sync_s": reh["predicted"]["fragment_sync_s"],
            "first_sync_s": syncs[0] if syncs else None,
            "steady_sync_s": statistics.mean(syncs[1:]) if len(syncs) > 1 else None,
            "steady_utilization": statistics.mean(util) if util else None,
            "run_utilization": reh["measured"]["compute_utilization"],
            "syncs": len(syncs),
            "plan": {k: plan[k] for k in ("interval", "fragments", "codec", "lanes")},
            "local_sync_s": plan.get("local_sync_s", {}),
        })
    def fig(key, digits=4):
        xs = [r[key] for r in runs if r[key] is not None]
        return benchlib.spread(xs, digits) if xs else None
    pu, ps = fig("predicted_utilization"), fig("predicted_sync_s")
    mu, ms = fig("steady_utilization"), fig("steady_sync_s")
    ratios = {
        "sync_measured_over_predicted": round(ms["median"] / ps["median"], 3) if ms and ps else None,
        "utilization_measured_over_predicted": round(mu["median"] / pu["median"], 3) if mu and pu else None,
    }
    for k, v in ratios.items():
        if v is not None:
            off = max(v, 1 / v)
            if worst is None or off > worst["off_by"]:
                worst = {"scenario": sc, "figure": k, "ratio": v, "off_by": round(off, 3)}
    result[sc] = {"predicted_utilization": pu, "steady_utilization": mu, "run_utilization": fig("run_utilization"),
                  "predicted_sync_s": ps, "steady_sync_s": ms, "first_sync_s": fig("first_sync_s"),
                  "plans": [r["plan"] for r in runs], "local_sync_s": [r["local_sync_s"] for r in runs],
                  "ratio": ratios}
print(json.dumps({
    "benchmark": "rehearsal",
    "setting": "254M (configs/rehearse.yaml), 2 sites x 2 fsdp ranks, 0.5 s stand-in steps, int8+zstd3 base, "
               "outer.plan: auto target 0.8 H>=10, through tools/wan; steady = after the first sync",
    "geoloco": "measured (the real outer loop)",
    "peer": "outer.plan: auto's prediction for the same inputs",
    "scenarios": result,
    "worst": worst,
    **benchlib.load_record(),
}, indent=2))

"""bench/pace/summarize.py OUT: the JSON of bench/pace/run.sh from its runs in OUT."""
import glob
import json
import os
import statistics
import sys

import benchlib

out = sys.argv[1]
rows = {}
for summary in sorted(glob.glob(os.path.join(out, "*-*", "summary.json"))):
    name, seed = os.path.basename(os.path.dirname(summary)).rsplit("-", 1)
    with open(summary) as f:
        s = json.load(f)
    util = []
    with open(os.path.join(os.path.dirname(summary), "sites", "paris", "metrics.jsonl")) as f:
        for line in f:
            m = json.loads(line)
            if "compute_utilization" in m and 3 <= m.get("outer_step", 0) <= 11:
                util.append(m["compute_utilization"])
    lyon = [r for r in s["ranks"] if r["site"] == "lyon"][0]
    trained = lyon.get("pace", {}).get("trained_steps", lyon["steps"] - lyon.get("steps_skipped", 0))
    rows.setdefault(name, []).append({
        "seed": int(seed),
        "fast_site_utilization": statistics.mean(util) if util else None,
        "lyon_trained_share": trained / lyon["steps"],
        "wall_s": s["wall_s"],
        "val_loss": s["val_loss"],
    })

def figure(name):
    rs = sorted(rows.get(name, []), key=lambda r: r["seed"])
    losses = [r["val_loss"] for r in rs]
    return {
        "fast_site_utilization": benchlib.spread([r["fast_site_utilization"] for r in rs], 4),
        "lyon_trained_share": benchlib.spread([r["lyon_trained_share"] for r in rs], 3),
        "wall_s": benchlib.spread([r["wall_s"] for r in rs], 2),
        "val_loss": {"mean": round(statistics.mean(losses), 4), "min": round(min(losses), 4),
                     "max": round(max(losses), 4), "all": [round(x, 4) for x in losses]},
    }

res = {name: figure(name) for name in ("equal", "slow_steps", "slow_time")}
geo, peer, eq = res["slow_time"], res["slow_steps"], res["equal"]
print(json.dumps({
    "benchmark": "pace",
    "setting": "2 sites x 1 rank, loopback, 2-layer width-128 GPT, 16 seq/step/site, H 20, 240 steps, "
               "lyon at half speed (sites[1].slowdown 2); utilization: paris, outer steps 3-11",
    "geoloco": {"config": "slow_time (outer.pace: time)", **geo},
    "peer": {"config": "slow_steps (outer.pace: steps)", **peer},
    "reference": {"config": "equal speeds, pace: steps", **eq},
    "ratio": {
        "fast_site_utilization": round(geo["fast_site_utilization"]["median"] / peer["fast_site_utilization"]["median"], 3),
        "wall_s": round(geo["wall_s"]["median"] / peer["wall_s"]["median"], 3),
        "val_loss_vs_peer": round(geo["val_loss"]["mean"] / peer["val_loss"]["mean"], 4),
        "val_loss_vs_equal": round(geo["val_loss"]["mean"] / eq["val_loss"]["mean"], 4),
    },
    **benchlib.load_record(),
}, indent=2))

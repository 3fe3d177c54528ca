"""bench/exchange/summarize.py OUT RATE: the JSON of bench/exchange/run.sh from its runs in OUT."""
import glob
import json
import os
import re
import statistics
import sys

import benchlib

out, rate = sys.argv[1], float(sys.argv[2])
rows = {}
for summary in sorted(glob.glob(os.path.join(out, "s*-*-*", "summary.json"))):
    m = re.match(r"s(\d+)-(all_to_all|owner)-(\d+)$", os.path.basename(os.path.dirname(summary)))
    S, ex, seed = int(m.group(1)), m.group(2), int(m.group(3))
    with open(summary) as f:
        s = json.load(f)
    rounds = s["outer_steps"]
    per_site = [r["wan_bytes_sent"] / rounds for r in s["ranks"]]
    sync = [r["sync_seconds_mean"] for r in s["ranks"]]
    rows.setdefault((S, ex), []).append({
        "seed": seed,
        "bytes_per_site_per_round": statistics.mean(per_site),
        "sync_s": statistics.mean(sync),
        "val_loss": s["val_loss"],
        "hashes": len({r["global_weights_hash"] for r in s["ranks"]}),
    })


def figure(S, ex):
    rs = sorted(rows[(S, ex)], key=lambda r: r["seed"])
    losses = [r["val_loss"] for r in rs]
    assert all(r["hashes"] == 1 for r in rs), f"{S} sites {ex}: the sites ended on different hashes"
    return {
        "bytes_per_site_per_round": benchlib.spread([r["bytes_per_site_per_round"] for r in rs], 0),
        "sync_s": benchlib.spread([r["sync_s"] for r in rs], 4),
        "val_loss": {"mean": round(statistics.mean(losses), 4),
                     "spread": round(max(losses) - min(losses), 4),
                     "all": [round(x, 4) for x in losses]},
    }


by_sites = {}
for S in sorted({k[0] for k in rows}):
    geo, peer = figure(S, "owner"), figure(S, "all_to_all")
    by_sites[str(S)] = {
        "geoloco": {"config": "outer.exchange: owner", **geo},
        "peer": {"config": "outer.exchange: all_to_all", **peer},
        "ratio": {
            "bytes_per_site_per_round": round(geo["bytes_per_site_per_round"]["median"] /
                                              peer["bytes_per_site_per_round"]["median"], 4),
            "model_bytes_ratio": round(2.0 / S, 4),  # 2(S-1)/S over S-1
            "sync_s": round(geo["sync_s"]["median"] / peer["sync_s"]["median"], 3),
            "val_loss_mean_difference": round(geo["val_loss"]["mean"] - peer["val_loss"]["mean"], 4),
            "val_loss_seed_spread": max(geo["val_loss"]["spread"], peer["val_loss"]["spread"]),
        },
    }
print(json.dumps({
    "benchmark": "exchange",
    "setting": f"S sites x 1 rank on loopback, 2-layer width-128 GPT, 8 seq/step/site, H 20, 120 steps, "
               f"int4 + error feedback + zstd 1, blocking; every site pair's link emulated at {rate:g} Mbit/s, "
               f"10 ms one way (transport.emulate)",
    "sites": by_sites,
    **benchlib.load_record(),
}, indent=2))

"""bench/sync_phases/summarize.py OUT N SIZE... CODEC...: the JSON of run.sh (read it first).

Per size and codec, over the runs: the median sync (rounds.jsonl sync_s) and its phases from
paris/0's trace (each span kind's median over the syncs after the first, then the median over
the runs), the rest of the sync no span covers (the pseudo-gradient's pass and the loop's own
bookkeeping), the outer loop's bytes per parameter (summary outer_memory), the envelope bytes, the raw exchange of the same bytes (bench_transport), and
network / raw: how far the sync's send-and-receive is from what the transport alone takes.
"""
import json
import os
import statistics
import sys

from benchlib import load_record, spread

out = sys.argv[1]
n_sizes = int(sys.argv[2])
sizes = sys.argv[3 : 3 + n_sizes]
codecs = sys.argv[3 + n_sizes :]
runs = int(os.environ["BENCH_RUNS"])
# The sync's spans on the inner loop's thread (blocking): receive covers the whole exchange
# (it starts with the sends), decode the decode and weighted sum of every site's frame.
PHASES = ["compress", "receive", "decode", "outer_optimizer", "outer_step", "membership_vote", "membership",
          "hash_check"]


def run_figures(d):
    rounds = [json.loads(l) for l in open(os.path.join(d, "sites/paris/rounds.r0.jsonl"))]
    trace = json.load(open(os.path.join(d, "sites/paris/trace.r0.json")))
    spans = {}
    for e in trace["events"]:
        if "dur" in e and e["name"] in PHASES:
            spans.setdefault(e["name"], []).append((e["ts"], e["dur"] / 1e6))
    later = lambda xs: [v for _, v in sorted(xs)[1:]] or [v for _, v in xs]  # syncs after the first
    f = {"sync_s": statistics.median([r["sync_s"] for r in rounds[1:]] or [rounds[0]["sync_s"]])}
    for p in PHASES:
        f[p] = statistics.median(later(spans[p])) if p in spans else 0.0
    f["other"] = max(0.0, f["sync_s"] - sum(f[p] for p in PHASES))
    f["envelope_bytes"] = rounds[-1]["bytes_per_peer"]
    f["elements"] = rounds[-1]["elements"]
    t = json.load(open(d + ".transport.json"))["results"][0]
    f["raw_exchange_s"] = t["seconds_median"] * f["envelope_bytes"] / t["size_bytes"]
    f["outer_memory"] = json.load(open(os.path.join(d, "sites/paris/rank0.json")))["outer_memory"]
    return f


result = {"bench": "sync_phases", "what": "blocking sync phases, 2 sites x 1 rank on loopback, rehearsal",
          **load_record(), "results": []}
for size in sizes:
    for codec in codecs:
        figs = [run_figures(os.path.join(out, f"{size}-{codec}-{r}")) for r in range(1, runs + 1)]
        med = lambda k: statistics.median(f[k] for f in figs)
        row = {"size": size, "codec": codec, "elements": figs[0]["elements"],
               "envelope_bytes": figs[0]["envelope_bytes"],
               "sync_s": spread([f["sync_s"] for f in figs], 4),
               "phases_s": {p: round(med(p), 4) for p in PHASES + ["other"]},
               "geoloco_network_s": spread([f["receive"] for f in figs], 4),
               "peer_raw_exchange_s": spread([f["raw_exchange_s"] for f in figs], 4)}
        row["network_over_raw"] = round(med("receive") / med("raw_exchange_s"), 3)
        row["sync_over_raw"] = round(med("sync_s") / med("raw_exchange_s"), 3)
        row["codec_in_sync_share"] = round((med("compress") + med("decode")) / med("sync_s"), 3)
        # The outer loop's own bytes per parameter of the rank's shard (summary outer_memory:
        # kept between rounds, and the rounds' buffers at their peak).
        mem = figs[0]["outer_memory"]
        row["outer_bytes_per_param"] = {k: round(mem[k], 2) for k in
                                        ("kept_bytes_per_param", "round_bytes_per_param", "bytes_per_param")}
        result["results"].append(row)
print(json.dumps(result, indent=1))

#!/usr/bin/env bash
# Sync-sized transfers over emulated WAN paths (tools/wan: network namespaces, a real TCP path
# with the scenario's delay and rate): bench_transport's time for each size (sent, verified,
# and a 1-byte "done" back: add half a round trip), once with transport.eager_bytes 0 (UCX's
# rendezvous for every chunk above its threshold: the peer figure, geoloco before eager
# messages) and once with the default 8 MiB (messages up to that size sent eagerly), in the
# same run. Prints one JSON document: per scenario and size, both medians and their ratio,
# plus the round trips each implies ((time - size/rate) / RTT). Root (namespaces).
#
#   bench/transport/wan.sh [--allow-load] [BUILD_DIR]        (default: build)
#
# The discipline of bench/lib.sh: refuses to start above load average 1.0 unless --allow-load
# (then "loaded": true); BENCH_RUNS (5) rounds, each running both modes in turn (REPS timed
# transfers per size each); the times are medians over the rounds, with min and max.
# Environment: SCENARIOS (default "regional-1g continental-1g"), SIZES_KIB (default
# "800 4096 16384 65536"), BENCH_RUNS (5), REPS (timed transfers per size per round, after one
# warm-up; 1), GAP_MS (idle before each transfer, as between outer syncs; default 1000),
# EAGER_KIB (the eager_bytes under test, default 8192), PORT (31000).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
source "$root/bench/lib.sh"
bench_init "$@"
set -- "${bench_args[@]}"
build="$(readlink -f "${1:-$root/build}")"
bench="$build/bench/transport/bench_transport"
[[ -x "$bench" ]] || { echo "wan.sh: no bench_transport under $build (build it first)" >&2; exit 2; }
((EUID == 0)) || { echo "wan.sh: needs root (network namespaces)" >&2; exit 2; }
read -r -a scenarios <<<"${SCENARIOS:-regional-1g continental-1g}"
read -r -a sizes <<<"${SIZES_KIB:-800 4096 16384 65536}"
reps="${REPS:-1}"
gap="${GAP_MS:-1000}"
eager="${EAGER_KIB:-8192}"
port="${PORT:-31000}"
out="$(mktemp -d /tmp/geoloco-bench-wan-transport.XXXXXX)"
trap 'rm -rf "$out"' EXIT

# One side per site namespace: site 0 is "a" (sender, prints the JSON), site 1 is "b".
side='
set -euo pipefail
IFS=, read -r -a addrs <<<"$GEOLOCO_WAN_ADDRS"
me="$GEOLOCO_WAN_SITE_INDEX"; other=$((1 - me)); role=a; ((me == 0)) || role=b
exec "$BENCH" --role "$role" --listen "${addrs[$me]}:$PORT" --peer "${addrs[$other]}:$PORT" \
  --sizes-kib $SIZES --reps "$REPS" --gap-ms "$GAP" --eager-kib "$EAGER" >"$OUT/$role.json"'

results=()
for sc in "${scenarios[@]}"; do
  [[ -f "$root/configs/wan/$sc.yaml" ]] || { echo "wan.sh: no scenario $root/configs/wan/$sc.yaml" >&2; exit 2; }
done
for ((round = 0; round < BENCH_RUNS; ++round)); do
  for sc in "${scenarios[@]}"; do
    file="$root/configs/wan/$sc.yaml"
    for e in 0 "$eager"; do
      echo "wan.sh: round $round: $sc eager_kib=$e sizes=${sizes[*]} KiB reps=$reps gap=${gap}ms" >&2
      dir="$out/$sc-$e-$round"
      mkdir -p "$dir"
      BENCH="$bench" PORT="$port" SIZES="${sizes[*]}" REPS="$reps" GAP="$gap" EAGER="$e" OUT="$dir" \
        "$root/tools/wan/run" --no-check --timeout 900 "$file" -- bash -c "$side" >"$dir/run.log" 2>&1 \
        || { echo "wan.sh: run failed ($sc, eager $e, round $round):" >&2; tail -20 "$dir/run.log" >&2; exit 1; }
      results+=("$sc" "$e" "$dir/a.json")
    done
  done
done
bench_finish

python3 - "$eager" "$root" "${results[@]}" <<'PY'
import json, statistics, sys, re
import benchlib
eager = int(sys.argv[1]) * 1024
root = sys.argv[2]
args = sys.argv[3:]
runs = {}  # scenario -> eager bytes -> [a.json of each round]
for i in range(0, len(args), 3):
    sc, e, path = args[i], int(args[i + 1]) * 1024, args[i + 2]
    runs.setdefault(sc, {}).setdefault(e, []).append(json.load(open(path)))
def link(sc):
    text = open(f"{root}/configs/wan/{sc}.yaml").read()
    num = lambda k: float(re.search(rf"^\s*{k}:\s*([0-9.]+)", text, re.M).group(1))
    one_way_ms = num("km") * num("us_per_km") / 1000 + num("overhead_ms")
    return 2 * one_way_ms / 1000, num("rate_mbit") * 1e6
doc = {"bench": "transport over emulated WAN (tools/wan)", "peer": "eager_bytes 0 (rendezvous)",
       "eager_bytes": eager, "scenarios": []}
for sc, by in runs.items():
    rtt, rate = link(sc)
    rows = []
    for i, base in enumerate(by[0][0]["results"]):
        # one time per round: that round's median of its REPS timed transfers
        b = [r["results"][i]["seconds_median"] for r in by[0]]
        n = [r["results"][i]["seconds_median"] for r in by[eager]]
        bm, nm = statistics.median(b), statistics.median(n)
        wire = base["size_bytes"] * 8 / rate
        rtts = lambda t: round((t - wire) / rtt, 2)
        rows.append({"size_bytes": base["size_bytes"], "wire_s": round(wire, 4),
                     "rendezvous_s": round(bm, 4), "eager_s": round(nm, 4),
                     "rendezvous_runs_s": benchlib.spread(b, 4), "eager_runs_s": benchlib.spread(n, 4),
                     "ratio_rendezvous_over_eager": round(bm / nm, 2),
                     "rendezvous_rtts": rtts(bm), "eager_rtts": rtts(nm)})
    doc["scenarios"].append({"scenario": sc, "rtt_s": rtt, "rate_bit_s": rate, "gap_ms": by[0][0]["gap_ms"], "sizes": rows})
doc.update(benchlib.load_record())
print(json.dumps(doc, indent=1))
PY

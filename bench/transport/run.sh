#!/usr/bin/env bash
# Outer-sync goodput of geoloco::transport next to ucx_perftest tag_bw, same machine, same
# run, both over UCX_TLS=tcp on loopback. Sizes 16/64/256 MiB; perftest sends messages of the
# same size (tag_bw streams them with a window). Usage: run.sh [--allow-load] [build_dir] [reps]
# The discipline of bench/lib.sh: refuses to start above load average 1.0 unless --allow-load
# (then "loaded": true); BENCH_RUNS (5) rounds, each one perftest pass over the sizes and one
# bench_transport pass (one warm-up, then `reps` timed transfers per size, default 1), alternating.
# Prints one JSON document: per size the median over the rounds of geoloco's goodput and of
# perftest's (both MiB/s, with min and max) and the ratio of the medians.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source "$root/bench/lib.sh"
bench_init "$@"
set -- "${bench_args[@]}"
BUILD=${1:-build}
REPS=${2:-1}
BENCH="$BUILD/bench/transport/bench_transport"
[[ -x "$BENCH" ]] || BENCH="$BUILD/bench_transport/bench_transport"
[[ -x "$BENCH" ]] || { echo "bench_transport not found under $BUILD" >&2; exit 2; }
command -v ucx_perftest >/dev/null || { echo "ucx_perftest not found (apt-get install ucx-utils)" >&2; exit 2; }
SIZES=(16 64 256)
export UCX_TLS=tcp UCX_NET_DEVICES=lo
tmp=$(mktemp -d)
server_pid=""
cleanup() { [[ -n "$server_pid" ]] && kill "$server_pid" 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT

perftest() {  # size_bytes iterations -> overall MiB/s
  local size=$1 iters=$2 port
  port=$(( 20000 + RANDOM % 20000 ))
  ucx_perftest -p "$port" >"$tmp/server.log" 2>&1 &
  server_pid=$!
  sleep 0.5
  ucx_perftest 127.0.0.1 -p "$port" -t tag_bw -s "$size" -n "$iters" >"$tmp/client.log" 2>&1
  wait "$server_pid" || true
  server_pid=""
  awk '/^Final:/ {print $7}' "$tmp/client.log"
}

: >"$tmp/perftest"
for ((r = 0; r < BENCH_RUNS; ++r)); do
  for mib in "${SIZES[@]}"; do
    bytes=$(( mib << 20 ))
    iters=$(( 2048 / mib )); (( iters < 8 )) && iters=8
    echo "$mib $(perftest "$bytes" "$iters")" >>"$tmp/perftest"
  done
  "$BENCH" --sizes-mib "${SIZES[@]}" --reps "$REPS" | tail -n 1 >"$tmp/ours.$r.json"
done
bench_finish

python3 - "$tmp" "$BENCH_RUNS" "${SIZES[*]}" <<'PY'
import json, statistics, sys
import benchlib
tmp, n, sizes = sys.argv[1], int(sys.argv[2]), [int(s) for s in sys.argv[3].split()]
ours = [json.loads(open(f"{tmp}/ours.{r}.json").read()) for r in range(n)]
peer = {m: [] for m in sizes}
for line in open(f"{tmp}/perftest"):
    mib, v = line.split()
    peer[int(mib)].append(float(v))
rows = []
for i, mib in enumerate(sizes):
    # one figure per round: MiB / that round's median transfer time (of `reps` timed transfers)
    g = [mib / o["results"][i]["seconds_median"] for o in ours]
    p = peer[mib]
    gm, pm = statistics.median(g), statistics.median(p)
    rows.append({
        "size_mib": mib,
        "geoloco_goodput_mib_s": round(gm, 1),
        "geoloco_runs_mib_s": benchlib.spread(g, 1),
        "ucx_perftest_tag_bw_mib_s": round(pm, 1),
        "ucx_perftest_runs_mib_s": benchlib.spread(p, 1),
        "ratio": round(gm / pm, 3) if pm > 0 else None,
    })
doc = {"benchmark": "transport outer-sync goodput, 2 sites, loopback, UCX_TLS=tcp",
       "geoloco": {k: ours[0][k] for k in ("lanes", "chunk_mib", "inflight", "mode")},
       "peer": "ucx_perftest -t tag_bw (same message size)",
       "results": rows,
       "target_ratio": 0.8}
doc.update(benchlib.load_record())
print(json.dumps(doc, indent=1))
PY

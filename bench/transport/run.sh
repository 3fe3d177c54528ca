#!/usr/bin/env bash
# Outer-sync goodput of geoloco::transport next to ucx_perftest tag_bw, same machine, same
# run, both over UCX_TLS=tcp on loopback. Sizes 16/64/256 MiB; perftest sends messages of the
# same size (tag_bw streams them with a window). Usage: run.sh [build_dir] [reps]
# Prints one JSON document: per size geoloco's median goodput, perftest's overall bandwidth
# (both MiB/s) and the ratio. The 2-core dev machines swing up to 2x: compare the ratio.
set -euo pipefail
BUILD=${1:-build}
REPS=${2:-5}
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

declare -A PT
for mib in "${SIZES[@]}"; do
  bytes=$(( mib << 20 ))
  iters=$(( 2048 / mib )); (( iters < 8 )) && iters=8
  PT[$mib]=$(perftest "$bytes" "$iters")
done
ours=$("$BENCH" --sizes-mib "${SIZES[@]}" --reps "$REPS" | tail -n 1)
# Second perftest pass after ours, so drift in machine load shows up in the spread.
declare -A PT2
for mib in "${SIZES[@]}"; do
  bytes=$(( mib << 20 ))
  iters=$(( 2048 / mib )); (( iters < 8 )) && iters=8
  PT2[$mib]=$(perftest "$bytes" "$iters")
done

python3 - "$ours" "${SIZES[*]}" "$(for m in "${SIZES[@]}"; do echo -n "${PT[$m]},${PT2[$m]} "; done)" <<'PY'
import json, sys
ours = json.loads(sys.argv[1])
sizes = [int(s) for s in sys.argv[2].split()]
pts = [tuple(float(x) for x in p.split(",")) for p in sys.argv[3].split()]
rows = []
for r, mib, (p1, p2) in zip(ours["results"], sizes, pts):
    peer = (p1 + p2) / 2
    rows.append({
        "size_mib": mib,
        "geoloco_goodput_mib_s": round(r["goodput_mib_s_median"], 1),
        "geoloco_best_mib_s": round(r["goodput_mib_s_best"], 1),
        "ucx_perftest_tag_bw_mib_s": round(peer, 1),
        "ucx_perftest_runs_mib_s": [p1, p2],
        "ratio": round(r["goodput_mib_s_median"] / peer, 3) if peer > 0 else None,
    })
print(json.dumps({"benchmark": "transport outer-sync goodput, 2 sites, loopback, UCX_TLS=tcp",
                  "geoloco": {k: ours[k] for k in ("lanes", "chunk_mib", "inflight", "mode")},
                  "peer": "ucx_perftest -t tag_bw (same message size)",
                  "results": rows,
                  "target_ratio": 0.8}, indent=1))
PY

#!/usr/bin/env bash
# tests/tools/wan/link_cut_run.sh PREFIX SITE_IF SCENARIO CONFIG OUT_DIR CUT_S MIN_BYTES RUN_TIMEOUT_S
# Runs a geoloco training through tools/wan/run and cuts one link in the middle of a sync:
# it watches the router's interface SITE_IF (toward the second site) and, once MIN_BYTES more
# than the bytes seen right after the connections came up have crossed it (a pseudo-gradient
# transfer is under way: between syncs the sites exchange nothing), sets it down for CUT_S
# seconds, then up again. Prints one JSON line (the cut's timing and byte counts, the run's
# exit status); the run's own output goes to OUT_DIR/run.log. Every loop is bounded; the run
# is bounded by RUN_TIMEOUT_S (tools/wan/run --timeout) and tears the emulator down itself.
set -euo pipefail
(($# == 8)) || { echo "usage: $0 PREFIX SITE_IF SCENARIO CONFIG OUT_DIR CUT_S MIN_BYTES RUN_TIMEOUT_S" >&2; exit 2; }
prefix="$1" ifc="$2" scenario="$3" config="$4" out="$5" cut_s="$6" min_bytes="$7" run_timeout="$8"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
router="$prefix-router"
mkdir -p "$out"

"$root/tools/wan/run" --prefix "$prefix" --no-check --timeout "$run_timeout" --output-dir "$out" \
  "$scenario" "$config" >"$out/run.log" 2>&1 &
run_pid=$!
restore() { ip -n "$router" link set "$ifc" up 2>/dev/null || true; }
trap 'restore; kill -TERM $run_pid 2>/dev/null || true' EXIT

tx() { ip netns exec "$router" cat "/sys/class/net/$ifc/statistics/tx_bytes" 2>/dev/null || echo -1; }
now() { date +%s.%N; }

# 1. The workers are up once the run says so (bring-up takes a while on a loaded host).
base=-1
for ((i = 0; i < 1200; i++)); do
  kill -0 $run_pid 2>/dev/null || break
  if grep -q "run: started" "$out/run.log" 2>/dev/null; then base="$(tx)"; break; fi
  sleep 0.1
done
# 2. Wait for sync traffic: MIN_BYTES beyond the baseline (connections and handshakes are a
#    few kB).
cut_at=-1 before=-1
if ((base >= 0)); then
  for ((i = 0; i < 1200; i++)); do
    kill -0 $run_pid 2>/dev/null || break
    b="$(tx)"
    if ((b >= base + min_bytes)); then before="$b"; cut_at="$(now)"; break; fi
    sleep 0.05
  done
fi
down_bytes=-1 during=-1 up_at=-1 alive_after_cut=0 workers=-1
if [[ "$cut_at" != -1 ]]; then
  ip -n "$router" link set "$ifc" down
  down_bytes="$(tx)"  # `ip link set down` itself can take a second on a loaded host
  sleep "$cut_s"
  during="$(tx)"
  kill -0 $run_pid 2>/dev/null && alive_after_cut=1
  # Workers still running in the site namespaces (gone namespaces count as none).
  workers=0
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$prefix-" | grep -v -- "-router$" || true); do
    workers=$((workers + $(ip netns pids "$ns" 2>/dev/null | wc -l)))
  done
  restore
  up_at="$(now)"
fi
rc=0
wait $run_pid || rc=$?
end_at="$(now)"
trap - EXIT
printf '{"baseline_bytes":%s,"bytes_at_cut":%s,"bytes_link_down":%s,"bytes_end_of_cut":%s,"cut_at":%s,"up_at":%s,"end_at":%s,"alive_at_end_of_cut":%s,"workers_at_end_of_cut":%s,"run_status":%s}\n' \
  "$base" "$before" "$down_bytes" "$during" "$cut_at" "$up_at" "$end_at" "$alive_after_cut" "$workers" "$rc"

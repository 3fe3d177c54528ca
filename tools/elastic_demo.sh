#!/bin/bash
# Watch a campus die, the run go on, and the campus rejoin (docs/elastic.md): launches
# configs/elastic.yaml (three sites), SIGKILLs site lyon's process once outer step 3 is
# logged; the launcher takes only lyon down and restarts it 3 s later with --join (a round
# takes it in, it fetches the committed state from paris and milan, verified, and trains on);
# all three finish. Exit status: 0 when the launch exits 0 with lyon a member at the end.
#   tools/elastic_demo.sh [CONFIG] [SITE]
set -u
cd "$(dirname "$0")/.."
config=${1:-configs/elastic.yaml}
victim=${2:-lyon}
log=$(mktemp /tmp/geoloco-elastic.XXXXXX.log)
trap 'rm -f "$log"' EXIT
build/geoloco launch "$config" --restart-backoff-s 3 --set run.output_dir=runs/elastic-demo >"$log" 2>&1 &
launch=$!
tail -f --pid=$launch "$log" &
until grep -q "outer step 3 at inner step" "$log" 2>/dev/null; do
  kill -0 "$launch" 2>/dev/null || break
  sleep 0.2
done
pid=$(pgrep -f "worker $config --site $victim" | head -1)
if [ -n "$pid" ]; then
  echo "elastic_demo: SIGKILL to site $victim (pid $pid); the launcher restarts it with --join"
  kill -KILL "$pid"
fi
wait "$launch"
rc=$?
sleep 0.3  # let tail print the last lines
membership=$(python3 -c 'import json; m=json.load(open("runs/elastic-demo/summary.json"))["membership"]; print({k: m[k] for k in ("members", "evictions", "joins")})' 2>/dev/null)
echo "elastic_demo: launch exited $rc; membership: $membership"
[ "$rc" -eq 0 ] && [ -n "$pid" ] && grep -q "'$victim'" <<<"${membership%%'evictions'*}"

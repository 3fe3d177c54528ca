#!/bin/bash
# Watch a campus die, the run go on, and the campus rejoin (docs/elastic.md): launches
# configs/elastic.yaml (three sites), SIGKILLs site lyon's process once outer step 3 is
# logged, restarts it 3 s later with `geoloco worker ... --join` (a round takes it in, it
# fetches the committed state from paris and milan, verified, and trains on), and waits for
# all three to finish. Exit status: 0 when the launch and the rejoined site both exit 0.
#   tools/elastic_demo.sh [CONFIG] [SITE]
set -u
cd "$(dirname "$0")/.."
config=${1:-configs/elastic.yaml}
victim=${2:-lyon}
log=$(mktemp /tmp/geoloco-elastic.XXXXXX.log)
trap 'rm -f "$log"' EXIT
build/geoloco launch "$config" --set run.output_dir=runs/elastic-demo >"$log" 2>&1 &
launch=$!
tail -f --pid=$launch "$log" &
until grep -q "outer step 3 at inner step" "$log" 2>/dev/null; do
  kill -0 "$launch" 2>/dev/null || break
  sleep 0.2
done
pid=$(pgrep -f "worker $config --site $victim" | head -1)
if [ -n "$pid" ]; then
  echo "elastic_demo: SIGKILL to site $victim (pid $pid)"
  kill -KILL "$pid"
fi
rejoin_rc=1
if [ -n "$pid" ]; then
  sleep 3
  echo "elastic_demo: restarting site $victim with --join"
  build/geoloco worker "$config" --site "$victim" --rank 0 --join --set run.output_dir=runs/elastic-demo \
    >>"$log" 2>&1 &
  rejoin=$!
fi
wait "$launch"
rc=$?
if [ -n "$pid" ]; then
  wait "$rejoin"
  rejoin_rc=$?
fi
sleep 0.3  # let tail print the last lines
echo "elastic_demo: launch exited $rc, the rejoined $victim $rejoin_rc; membership: $(python3 -c 'import json; m=json.load(open("runs/elastic-demo/summary.json"))["membership"]; print({k: m[k] for k in ("members", "evictions", "joins")})' 2>/dev/null)"
[ "$rc" -eq 0 ] && [ "$rejoin_rc" -eq 0 ]

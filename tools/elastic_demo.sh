#!/bin/bash
# Watch a campus die and the run go on (docs/elastic.md): launches configs/elastic.yaml
# (three sites), SIGKILLs site lyon's process once outer step 3 is logged, and waits for the
# run to finish with the other two. Exit status: the launch's (0 when paris and milan finish).
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
wait "$launch"
rc=$?
sleep 0.3  # let tail print the last lines
echo "elastic_demo: launch exited $rc; evictions: $(python3 -c 'import json,sys; print(json.load(open("runs/elastic-demo/summary.json"))["membership"]["evictions"])' 2>/dev/null)"
exit $rc

#!/usr/bin/env bash
# Elastic sites against stop-and-resume (the peer: what geoloco did before sites could leave
# and rejoin): the wall time to finish the same run when one site is killed at the midpoint
# and comes back GAP_S seconds later, and the final validation loss of both.
#
# configs/elastic.yaml (three sites of one rank, H 25), STEPS inner steps, checkpoints every
# CKPT steps in both modes. At the midpoint (outer step STEPS/2/25 logged) site lyon's process
# is SIGKILLed.
#   elastic  `geoloco launch` with the config's min_sites 2: paris and milan go on without
#            lyon; the launcher restarts it GAP_S seconds later (--restart-backoff-s) with
#            --join, a round takes it in, and the run finishes with the three.
#   resume   the same run with outer.min_sites 3 (every site needed, as before elastic
#            sites): the launcher stops every site when lyon dies; GAP_S seconds after the kill
#            the whole run is launched again with --resume, from the newest checkpoint.
# Per run: the wall time from the first launch to the end of the last, the final validation
# loss (summary.json), and for elastic the join's round and the evictions. BENCH_RUNS pairs,
# alternated (elastic, resume, elastic, ...); the JSON has each figure's median, min and max,
# and the ratio elastic / resume of the medians. The discipline is bench/lib.sh's (load gate,
# load before and after, at least 5 runs).
#
#   bench/elastic/vs_resume.sh [--allow-load] [path/to/geoloco]      (default: build/geoloco)
#
# Environment: BENCH_RUNS (5), BENCH_MAX_LOAD (1.0), BENCH_ALLOW_LOAD (0), STEPS (2400), CKPT
# (500), GAP_S (30), SEED (1), PORT_BASE (29600), KEEP=1 keeps the runs. Prints ONE JSON
# document on stdout.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
source "$root/bench/lib.sh"
bench_init "$@"
set -- "${bench_args[@]}"
geoloco="$(readlink -f "${1:-$root/build/geoloco}")"
[[ -x "$geoloco" ]] || { echo "vs_resume.sh: no geoloco binary at $geoloco (build it, or pass its path)" >&2; exit 2; }
steps="${STEPS:-2400}"
ckpt="${CKPT:-500}"
gap="${GAP_S:-30}"
seed="${SEED:-1}"
port_base="${PORT_BASE:-29600}"
config="$root/configs/elastic.yaml"
half_round=$((steps / 2 / 25))
((half_round >= 1)) || { echo "vs_resume.sh: STEPS=$steps is too short (midpoint before outer step 1)" >&2; exit 2; }

out="$(mktemp -d /tmp/geoloco-bench-vs-resume.XXXXXX)"
cleanup() {
  pkill -KILL -f "geoloco(-bench)? .*$out" 2>/dev/null || true
  if [[ "${KEEP:-0}" == 1 ]]; then echo "vs_resume.sh: kept $out" >&2; else rm -rf "$out"; fi
}
trap cleanup EXIT

common=(--plain --set "run.seed=$seed" --set "train.steps=$steps" --set "train.checkpoint_every=$ckpt"
  --set "sites.0.port=$port_base" --set "sites.1.port=$((port_base + 10))" --set "sites.2.port=$((port_base + 20))")

now() { date +%s.%N; }

# kill_lyon_at_midpoint LOG LAUNCH_PID: waits for the midpoint line, SIGKILLs lyon, prints the time.
kill_lyon_at_midpoint() {
  local log="$1" launch="$2"
  until grep -q "outer step $half_round at inner step" "$log" 2>/dev/null; do
    kill -0 "$launch" 2>/dev/null || { echo "vs_resume.sh: the run ended before its midpoint; its output:" >&2; tail -30 "$log" >&2; exit 1; }
    sleep 0.05
  done
  local pid
  pid="$(pgrep -f "worker $config --site lyon" | head -1 || true)"
  [[ -n "$pid" ]] || { echo "vs_resume.sh: lyon's process was not found to kill" >&2; exit 1; }
  kill -KILL "$pid"
  now
}

# elastic NAME: one run; prints "WALL".
elastic() {
  local dir="$out/$1" log="$out/$1.log"
  local t0 t1
  t0="$(now)"
  (cd "$root" && "$geoloco" launch "$config" "${common[@]}" --restart-backoff-s "$gap" \
    --set "run.output_dir=$dir") >"$log" 2>&1 &
  local launch=$!
  kill_lyon_at_midpoint "$log" "$launch" >/dev/null
  if ! wait "$launch"; then
    echo "vs_resume.sh: elastic run '$1' failed; its output:" >&2
    tail -40 "$log" >&2
    exit 1
  fi
  t1="$(now)"
  awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f\n", b - a }'
}

# resume NAME: the stop-all run, then --resume GAP_S after the kill; prints "WALL".
resume() {
  local dir="$out/$1" log="$out/$1.log"
  local t0 t_kill t1
  t0="$(now)"
  (cd "$root" && "$geoloco" launch "$config" "${common[@]}" --set outer.min_sites=3 \
    --set "run.output_dir=$dir") >"$log" 2>&1 &
  local launch=$!
  t_kill="$(kill_lyon_at_midpoint "$log" "$launch")"
  if wait "$launch"; then
    echo "vs_resume.sh: resume run '$1': the first launch exited 0 although lyon was killed" >&2
    exit 1
  fi
  local left
  left="$(awk -v k="$t_kill" -v n="$(now)" -v g="$gap" 'BEGIN { d = k + g - n; if (d < 0) d = 0; printf "%.3f\n", d }')"
  sleep "$left"
  if ! (cd "$root" && "$geoloco" launch "$config" "${common[@]}" --set outer.min_sites=3 \
    --set "run.output_dir=$dir" --resume) >>"$log" 2>&1; then
    echo "vs_resume.sh: resume run '$1' failed after --resume; its output:" >&2
    tail -40 "$log" >&2
    exit 1
  fi
  t1="$(now)"
  awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f\n", b - a }'
}

args=()
for ((i = 1; i <= BENCH_RUNS; i++)); do
  echo "vs_resume.sh: pair $i of $BENCH_RUNS: elastic" >&2
  w="$(elastic "elastic_$i")"
  args+=(elastic "$w" "$out/elastic_$i")
  echo "vs_resume.sh: pair $i of $BENCH_RUNS: stop-and-resume" >&2
  w="$(resume "resume_$i")"
  args+=(resume "$w" "$out/resume_$i")
done
bench_finish

python3 "$here/vs_resume_summary.py" --steps "$steps" --ckpt "$ckpt" --gap "$gap" --seed "$seed" -- "${args[@]}"

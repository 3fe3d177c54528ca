#!/usr/bin/env bash
# Churn soak: four sites of two ranks (configs/elastic-churn.yaml, H = 25, min_sites 2) under
# `geoloco launch`, while whole sites and single ranks are SIGKILLed at random and the launcher
# restarts them with --join (docs/elastic.md). Not a ctest: the default run soaks for well
# over 10 minutes.
#
# Two runs, one after the other, same seed and steps:
#   baseline   no kills (the peer)
#   churn      a kill loop seeded by SEED: wait a random KILL_MIN_S..KILL_MAX_S seconds, pick a
#              site, then either SIGKILL every rank of it or one rank (the launcher then takes
#              the site's other rank down and restarts both); the next kill waits until the
#              killed site logged "site X: joined at outer round", so at most one site is out
#              at a time. No kill once the churn run is within STOP_BEFORE_S seconds of the
#              end at the baseline's pace (its inner step in the log), so the last restart
#              rejoins before the end.
# Checked on both runs (bench/elastic/churn_summary.py; exit 1 naming what broke):
#   every committed round's hash, members and tokens agree among all its members' lines
#   (sites/<site>/rounds.r<rank>.jsonl); rounds and steps only move forward in every file and
#   every round 1..N committed; each rank's membership.tokens adds up (not_committed =
#   trained - committed, committed_by_site = the tokens of the rounds it applied since
#   counted_after_round, trained = its steps since it joined); the launch exited 0, every rank
#   completed all the steps, every site is a member at the end, all on one global-weights hash.
# Reported per run: wall seconds, rounds committed, evictions, joins (bytes and seconds of each,
# from the joiners' log lines), restarts, compute utilization (mean and min over the ranks;
# a restarted rank's covers its last life), the fraction of the baseline's tokens that went
# into committed rounds, final val loss; churn over baseline for wall time and utilization.
#
#   bench/elastic/churn.sh [path/to/geoloco]      (default: build/geoloco)
#
# A soak (correctness under churn, with times beside): no load gate, but the load average
# before and after is recorded; the kill times depend on how fast the sites run.
#
# Environment: STEPS (9000: 12-18 minutes a run on the 2-core machine, with churn about as long),
# SEED (1: run.seed and the kill loop's), KILL_MIN_S (20), KILL_MAX_S (60), STOP_BEFORE_S
# (120), REJOIN_TIMEOUT_S (300: a killed site not rejoined by then fails the soak),
# MAX_RESTARTS (1000), RESTART_BACKOFF_S (2; the launcher doubles it per restart of a site, up
# to 30 s), PORT_BASE (default: a free block of the tests' port allocator,
# tests/support/ports.sh, held for the whole soak), KEEP=1 keeps the runs (path on stderr;
# a failed soak keeps them too, an interrupted one does not). Prints ONE JSON document on stdout.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
geoloco="$(readlink -f "${1:-$root/build/geoloco}")"
[[ -x "$geoloco" ]] || { echo "churn.sh: no geoloco binary at $geoloco (build it, or pass its path)" >&2; exit 2; }
steps="${STEPS:-9000}"
seed="${SEED:-1}"
kill_min="${KILL_MIN_S:-20}"
kill_max="${KILL_MAX_S:-60}"
stop_before="${STOP_BEFORE_S:-120}"
rejoin_timeout="${REJOIN_TIMEOUT_S:-300}"
max_restarts="${MAX_RESTARTS:-1000}"
backoff="${RESTART_BACKOFF_S:-2}"
config="$root/configs/elastic-churn.yaml"
sites=(paris lyon milan oslo)   # configs/elastic-churn.yaml's, in order
ranks=2
((kill_min >= 1 && kill_max >= kill_min)) || { echo "churn.sh: need 1 <= KILL_MIN_S <= KILL_MAX_S" >&2; exit 2; }

if [[ -n "${PORT_BASE:-}" ]]; then
  port_base="$PORT_BASE"
else
  # shellcheck source=SCRIPTDIR/../../tests/support/ports.sh
  source "$root/tests/support/ports.sh"
  geoloco_claim_ports || { echo "churn.sh: no free port block (set PORT_BASE)" >&2; exit 1; }
  port_base="$GEOLOCO_PORT_BASE"   # a block of 64: sites at + 0, 10, 20, 30 (+ ranks + store)
fi
ports=()
for i in "${!sites[@]}"; do ports+=(--set "sites.$i.port=$((port_base + 10 * i))"); done

out="$(mktemp -d /tmp/geoloco-bench-churn.XXXXXX)"
launch=""
ok=0
interrupted=0
# Only what this script started: the launch and its workers (children of the launch).
stop_launch() {
  [[ -n "$launch" ]] && kill -0 "$launch" 2>/dev/null || return 0
  local kids
  kids="$(pgrep -P "$launch" || true)"
  kill -TERM "$launch" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$launch" 2>/dev/null || break; sleep 0.2; done
  # shellcheck disable=SC2086
  kill -KILL "$launch" $kids 2>/dev/null || true
}
cleanup() {
  stop_launch
  if [[ "${KEEP:-0}" == 1 || ("$ok" != 1 && "$interrupted" != 1) ]]; then echo "churn.sh: kept $out" >&2
  else rm -rf "$out"; fi
}
trap cleanup EXIT
trap 'interrupted=1; exit 130' INT TERM

now() { echo "$EPOCHREALTIME"; }
elapsed() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }

# start NAME: launches the config into $out/NAME (log $out/NAME.log); sets $launch.
start() {
  local name="$1"
  echo "churn.sh: $name ($steps steps, seed $seed, ports from $port_base)" >&2
  "$geoloco" launch "$config" --plain --max-restarts "$max_restarts" --restart-backoff-s "$backoff" \
    --set "run.output_dir=$out/$name" --set "run.seed=$seed" --set "train.steps=$steps" "${ports[@]}" \
    >"$out/$name.log" 2>&1 &
  launch=$!
}

# finish NAME T0: waits for the launch; writes its exit code and wall seconds to $out/NAME.rc.
finish() {
  local name="$1" t0="$2" rc=0
  wait "$launch" || rc=$?
  launch=""
  echo "$rc $(elapsed "$t0")" >"$out/$name.rc"
  if ((rc != 0)); then
    echo "churn.sh: run '$name' exited $rc; the end of its output:" >&2
    tail -40 "$out/$name.log" >&2
  fi
}

# alive: the launch is still running.
alive() { kill -0 "$launch" 2>/dev/null; }

# joined_count SITE: how many times SITE logged its join so far in the churn log.
joined_count() { grep -c "\] info site $1: joined at outer round" "$out/churn.log" || true; }

# step_now: the newest inner step a site logged an outer step at in the churn run (0 before).
step_now() {
  local s
  s="$(grep -ao "\] info outer step [0-9]* at inner step [0-9]*" "$out/churn.log" | tail -1 || true)"
  s="${s##* }"
  echo "${s:-0}"
}

load_before="$(cut -d' ' -f1-3 /proc/loadavg)"

t0="$(now)"
start baseline
finish baseline "$t0"
read -r base_rc base_wall <"$out/baseline.rc"
((base_rc == 0)) || exit 1

# The kill loop. Every draw comes from bash's RANDOM seeded once, in this shell (never in a
# subshell, which would not advance it), four draws per kill whatever they are used for.
RANDOM="$seed"
kills="$out/kills.tsv"
: >"$kills"
# The last kill: STOP_BEFORE_S before the end at the baseline's steps a second.
stop_step=$(awk -v w="$base_wall" -v s="$stop_before" -v n="$steps" 'BEGIN { x = n - s * n / w; printf "%d", (x > 0 ? x : 0) }')
t0="$(now)"
start churn
while alive; do
  delay=$((kill_min + RANDOM % (kill_max - kill_min + 1)))
  victim="${sites[RANDOM % ${#sites[@]}]}"
  whole=$((RANDOM % 2))
  rank=$((RANDOM % ranks))
  at=$(awk -v t="$(elapsed "$t0")" -v d="$delay" 'BEGIN { printf "%d", t + d }')
  while alive && (($(elapsed "$t0" | cut -d. -f1) < at)); do sleep 0.5; done
  alive || break
  step="$(step_now)"
  ((step < stop_step)) || break
  if ((whole)); then pattern="worker $config --site $victim --rank "; what=site; else
    pattern="worker $config --site $victim --rank $rank "; what="rank$rank"; fi
  pids="$(pgrep -P "$launch" -f "$pattern" | tr '\n' ' ' || true)"
  if [[ -z "${pids// /}" ]]; then
    echo "churn.sh: no process of $victim ($what) to kill at $(elapsed "$t0") s" >&2
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$(elapsed "$t0")" "$step" "$victim" "$what" "none" "" >>"$kills"
    continue
  fi
  joined="$(joined_count "$victim")"
  # shellcheck disable=SC2086
  kill -KILL $pids 2>/dev/null || true
  t_kill="$(now)"
  echo "churn.sh: SIGKILL $victim ($what: pids ${pids% }) at $(elapsed "$t0") s, step $step" >&2
  # At most one site out: the next kill waits for this one's join.
  rejoin=""
  while alive; do
    if (($(joined_count "$victim") > joined)); then rejoin="$(elapsed "$t_kill")"; break; fi
    if grep -q "site $victim stays out of the run\|site $victim is not restarted" "$out/churn.log"; then break; fi
    (($(elapsed "$t_kill" | cut -d. -f1) < rejoin_timeout)) || break
    sleep 0.5
  done
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$(awk -v a="$t0" -v b="$t_kill" 'BEGIN { printf "%.1f", b - a }')" "$step" \
    "$victim" "$what" "${pids% }" "$rejoin" >>"$kills"
  if [[ -z "$rejoin" ]]; then
    echo "churn.sh: $victim did not rejoin after the kill (see $out/churn.log); no more kills" >&2
    break
  fi
  echo "churn.sh: $victim rejoined ${rejoin} s after the kill" >&2
done
echo "churn.sh: no more kills ($(elapsed "$t0") s); waiting for the churn run to finish" >&2
finish churn "$t0"
read -r churn_rc churn_wall <"$out/churn.rc"
load_after="$(cut -d' ' -f1-3 /proc/loadavg)"

/usr/bin/python3 "$here/churn_summary.py" --steps "$steps" --seed "$seed" --nproc "$(nproc)" \
  --load-before "$load_before" --load-after "$load_after" --kills "$kills" \
  --kill-window "$kill_min" "$kill_max" "$stop_step" \
  --baseline "$out/baseline" "$base_rc" "$base_wall" "$out/baseline.log" \
  --churn "$out/churn" "$churn_rc" "$churn_wall" "$out/churn.log"
ok=1

# bench/lib.sh: the one measurement discipline of every bench script that times geoloco
# against a peer (sourced; bench/benchlib.py is its Python half, used by the summaries).
#
#   source "$root/bench/lib.sh"
#   bench_init "$@"; set -- "${bench_args[@]}"     # takes --allow-load out of the arguments
#   for ((r = 0; r < BENCH_RUNS; ++r)); do <geoloco run r>; <peer run r>; done   # alternate
#   bench_finish                                   # load average after, for the JSON
#   python3 ... (benchlib.load_record() and benchlib.spread() write the JSON fields)
#
# Why: on a shared 2-core machine, other work (builds at load average 15-20) changed the
# geoloco/PyTorch ratio from ~1.3x to "1.9x-4.1x": the side that waits less wins. So:
#   * refuse to start when the 1-minute load average is above BENCH_MAX_LOAD (1.0) unless told
#     (--allow-load or BENCH_ALLOW_LOAD=1); such a run's JSON says "loaded": true;
#   * record the load average (1, 5, 15 min) before and after in the JSON ("after" includes the
#     benchmark's own processes: about one per thread it runs);
#   * alternate geoloco and the peer, BENCH_RUNS times (default 5, at least 5), and report the
#     median with min and max, never the best run.
# Environment: BENCH_RUNS (5), BENCH_MAX_LOAD (1.0), BENCH_ALLOW_LOAD (0).

bench_init() {
  bench_args=()
  local allow="${BENCH_ALLOW_LOAD:-0}" a
  for a in "$@"; do
    if [[ "$a" == --allow-load ]]; then allow=1; else bench_args+=("$a"); fi
  done
  BENCH_RUNS="${BENCH_RUNS:-5}"
  if ! [[ "$BENCH_RUNS" =~ ^[0-9]+$ ]] || ((BENCH_RUNS < 5)); then
    echo "$(basename "$0"): BENCH_RUNS=$BENCH_RUNS: expected an integer >= 5 (the median of fewer runs is noise)" >&2
    exit 2
  fi
  BENCH_MAX_LOAD="${BENCH_MAX_LOAD:-1.0}"
  BENCH_LOAD_BEFORE="$(cut -d' ' -f1-3 /proc/loadavg)"
  local now="${BENCH_LOAD_BEFORE%% *}"
  BENCH_LOADED=0
  if awk -v l="$now" -v m="$BENCH_MAX_LOAD" 'BEGIN { exit !(l > m) }'; then
    if [[ "$allow" != 1 ]]; then
      echo "$(basename "$0"): load average $now is above $BENCH_MAX_LOAD: figures taken now measure the other" \
           "work, not geoloco. Run on a quiet machine, or pass --allow-load (BENCH_ALLOW_LOAD=1) to run anyway:" \
           "the JSON then says \"loaded\": true and its figures are not comparable." >&2
      exit 3
    fi
    BENCH_LOADED=1
    echo "$(basename "$0"): load average $now > $BENCH_MAX_LOAD, running anyway (--allow-load): \"loaded\": true" >&2
  fi
  BENCH_ALLOW_LOAD="$allow"
  export BENCH_RUNS BENCH_MAX_LOAD BENCH_LOAD_BEFORE BENCH_LOADED BENCH_ALLOW_LOAD
  export PYTHONPATH="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)${PYTHONPATH:+:$PYTHONPATH}"
}

bench_finish() {
  BENCH_LOAD_AFTER="$(cut -d' ' -f1-3 /proc/loadavg)"
  export BENCH_LOAD_AFTER
}

# shellcheck shell=bash
# Shared functions of the WAN emulator scripts (up, down, check, run). Sourced, not run.
# Everything this creates lives inside network namespaces named "<prefix>-*" (veths,
# addresses, routes, qdiscs, iptables rules) plus delay-line processes inside them, so
# deleting the namespaces after killing their processes removes every trace. Nothing is
# added to the root namespace.

wan_here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
wan_root="$(cd "$wan_here/../.." && pwd)"

wan_log() { echo "wan: $*" >&2; }
wan_die() { echo "wan: error: $*" >&2; exit 1; }

# The geoloco binary with the wan-* subcommands: $GEOLOCO_BIN, else build/geoloco when it
# has them, else the development driver.
wan_find_bin() {
  if [[ -n "${GEOLOCO_BIN:-}" ]]; then
    [[ -x "$GEOLOCO_BIN" ]] || wan_die "GEOLOCO_BIN=$GEOLOCO_BIN is not executable"
    echo "$GEOLOCO_BIN"
    return
  fi
  local c
  for c in "$wan_root/build/geoloco" "$wan_root/build/tools/wan/geoloco_wan_dev" \
           "$wan_root"/build-*/tools/wan/geoloco_wan_dev; do
    # Listed among the subcommands (an unknown subcommand's --help may still exit 0).
    if [[ -x "$c" ]] && [[ "$("$c" --help 2>&1 || true)" == *wan-plan* ]]; then
      echo "$c"
      return
    fi
  done
  wan_die "no geoloco binary with the wan-* subcommands; build it or set GEOLOCO_BIN"
}

# Real-time priority for the delay lines and the check's ping-pong: on a busy host a normal
# process waits milliseconds for a CPU, which would show up as extra, random link delay. They
# sleep almost always, and the kernel's RT throttling (sched_rt_runtime_us) still caps them.
# Delay lines get GEOLOCO_WAN_RT_PRIO + 10 so that they preempt the measuring processes
# (SCHED_FIFO tasks of equal priority do not preempt each other). GEOLOCO_WAN_RT_PRIO=0: off.
# Usage: wan_rt_prefix [EXTRA]  -> "chrt -f PRIO" or nothing
wan_rt_prefix() {
  local prio="${GEOLOCO_WAN_RT_PRIO:-10}"
  [[ "$prio" =~ ^[0-9]+$ ]] || wan_die "GEOLOCO_WAN_RT_PRIO must be a number 0..89"
  ((prio == 0)) && return 0
  prio=$((prio + ${1:-0}))
  if command -v chrt >/dev/null && chrt -f "$prio" true 2>/dev/null; then
    echo "chrt -f $prio"
  fi
}

wan_require_root() {
  [[ $(id -u) -eq 0 ]] || wan_die "needs root (network namespaces, tc, iptables)"
  command -v ip >/dev/null || wan_die "iproute2 ('ip') is not installed"
  ip netns list >/dev/null 2>&1 || wan_die "'ip netns' does not work here"
}

wan_state_dir() { echo "${GEOLOCO_WAN_STATE:-/run/geoloco-wan}/$1"; }

# Kills every process inside the namespaces of this prefix (delay lines, servers, workers a
# crashed run left behind), then deletes the namespaces. Idempotent; used by down and by up
# to clean a stale run.
wan_cleanup() {
  local prefix="$1" ns pids any=0
  local -a nss=()
  while read -r ns _; do
    [[ "$ns" == "$prefix"-* ]] && nss+=("$ns")
  done < <(ip netns list 2>/dev/null)
  for ns in "${nss[@]}"; do
    pids="$(ip netns pids "$ns" 2>/dev/null || true)"
    if [[ -n "$pids" ]]; then
      any=1
      # shellcheck disable=SC2086  # word splitting wanted: one pid per word
      kill -TERM $pids 2>/dev/null || true
    fi
  done
  if ((any)); then
    # SIGTERM lets delay lines flush held packets and write stats; bounded wait, then KILL.
    local i
    for ((i = 0; i < 30; i++)); do
      any=0
      for ns in "${nss[@]}"; do
        [[ -n "$(ip netns pids "$ns" 2>/dev/null || true)" ]] && any=1
      done
      ((any)) || break
      sleep 0.1
    done
    for ns in "${nss[@]}"; do
      pids="$(ip netns pids "$ns" 2>/dev/null || true)"
      if [[ -n "$pids" ]]; then
        # shellcheck disable=SC2086
        kill -KILL $pids 2>/dev/null || true
      fi
    done
  fi
  # A delay line still starting when the namespaces' pids were listed (ip netns exec had not
  # entered the namespace yet) would outlive the deleted namespace: find it by its state path.
  local state j
  state="$(wan_state_dir "$prefix")"
  if pgrep -f -- "--stats-file $state/delayline-" >/dev/null 2>&1; then
    pkill -TERM -f -- "--stats-file $state/delayline-" 2>/dev/null || true
    for ((j = 0; j < 30; j++)); do
      pgrep -f -- "--stats-file $state/delayline-" >/dev/null 2>&1 || break
      sleep 0.1
    done
    pkill -KILL -f -- "--stats-file $state/delayline-" 2>/dev/null || true
  fi
  for ns in "${nss[@]}"; do
    ip netns del "$ns" 2>/dev/null || wan_log "could not delete namespace $ns"
  done
  # Keep the delay lines' final stats (written on SIGTERM above) for inspection after down.
  if compgen -G "$state/delayline-*.json" >/dev/null; then
    rm -rf "$state.last"
    mkdir -p "$state.last"
    cp "$state"/delayline-*.json "$state.last/" 2>/dev/null || true
  fi
  ((${#nss[@]})) && wan_log "removed ${#nss[@]} namespaces with prefix '$prefix'"
  return 0
}

# netem where the kernel has it; the userspace delay line otherwise. GEOLOCO_WAN_PATH forces one.
wan_detect_path() {
  local forced="${GEOLOCO_WAN_PATH:-auto}" probe="$1-probe" have=0
  case "$forced" in
    netem|delayline) echo "$forced"; return ;;
    auto) ;;
    *) wan_die "GEOLOCO_WAN_PATH must be auto, netem or delayline (got '$forced')" ;;
  esac
  ip netns del "$probe" 2>/dev/null || true
  ip netns add "$probe"
  ip -n "$probe" link set lo up
  if ip netns exec "$probe" tc qdisc add dev lo root netem delay 1ms 2>/dev/null; then have=1; fi
  ip netns del "$probe"
  if ((have)); then echo netem; else echo delayline; fi
}

# Loads the plan for scenario $1 (extra args go to wan-plan) into WAN_* variables.
wan_load_plan() {
  local bin="$1"; shift
  local plan
  plan="$("$bin" wan-plan "$@")" || wan_die "wan-plan failed for: $*"
  eval "$plan"
}

# netem arguments for one directed link: wan_netem_args DELAY_US JITTER_US LOSS_PCT MAXLEN
wan_netem_args() {
  local words=(delay "$1us")
  (($2 > 0)) && words+=("$2us")
  [[ "$3" != 0.000000 ]] && words+=(loss "$3%")
  words+=(limit "$4")
  echo "${words[*]}"
}

# Waits (bounded, 10 s) until something listens on TCP port $2 inside namespace $1.
wan_wait_listen() {
  local t
  for ((t = 0; t < 200; t++)); do
    ip netns exec "$1" ss -Hltn "sport = :$2" 2>/dev/null | grep -q . && return 0
    sleep 0.05
  done
  return 1
}

# Suspends (off) or resumes (on) the loss of directed link queue $3 in namespace/prefix state.
# delay line: SIGUSR1 / SIGUSR2 to its daemon; netem: tc qdisc change without / with loss.
wan_set_loss() {
  local state="$1" mode="$2" link="$3" router="$4" dev="$5"
  local src queue delay_us jitter_us loss_pct maxlen pid cls
  read -r src _ queue delay_us jitter_us loss_pct _ _ maxlen <<<"$link"
  if [[ "$(cat "$state/path")" == delayline ]]; then
    pid="$(head -1 "$state/delayline-$queue.ready")"
    kill "-$([[ $mode == off ]] && echo USR1 || echo USR2)" "$pid"
  else
    cls=$((src + 10))
    [[ $mode == off ]] && loss_pct=0.000000
    # shellcheck disable=SC2046  # the netem words
    ip netns exec "$router" tc qdisc change dev "$dev" parent "1:$cls" handle "$cls:" \
      netem $(wan_netem_args "$delay_us" "$jitter_us" "$loss_pct" "$maxlen")
  fi
}

# tests/trainer/launch/slurm/slurm_lib.sh: what the private-Slurm tests share (sourced). A test sets T (its
# temp dir) and then calls, in order: slurm_require, slurm_install_teardown, slurm_start_munge;
# writes $T/slurm.conf and exports SLURM_CONF; starts its daemons with slurm_daemon. Every
# wait is bounded; teardown stops the jobs, the daemons (in reverse order) and every process
# that carries this test's SLURM_CONF, and prints the daemons' logs on failure.
# Exit codes: 77 skipped (reason printed), 1 failure.

skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*" >&2; exit 1; }

pids=()  # daemons started, in start order
ns_cleanup=()  # commands run at teardown (namespaces a test created)

# Root, and the Slurm/munge binaries (installed with apt-get when missing, unless
# GEOLOCO_SLURM_NO_INSTALL=1).
slurm_require() {
  # Root is needed: slurmd launches tasks as the submitting user via slurmstepd, which must run
  # as root, and munged/slurmctld run here as SlurmUser=root.
  [[ $(id -u) -eq 0 ]] || skip "needs root to run slurmd/slurmstepd (uid $(id -u))"
  local required=(munged munge slurmctld slurmd srun sinfo scontrol scancel jq ss "$@")
  missing_bins() {
    local b out=()
    for b in "${required[@]}"; do
      command -v "$b" >/dev/null 2>&1 || out+=("$b")
    done
    echo "${out[*]}"
  }
  export PATH="$PATH:/usr/sbin:/sbin"  # the daemons live in sbin, absent from some PATHs
  local missing
  missing="$(missing_bins)"
  if [[ -n "$missing" ]]; then
    [[ "${GEOLOCO_SLURM_NO_INSTALL:-0}" != 1 ]] || skip "missing $missing (GEOLOCO_SLURM_NO_INSTALL=1)"
    command -v apt-get >/dev/null 2>&1 || skip "missing $missing and no apt-get to install slurm-wlm/munge"
    echo "slurm test: missing $missing; trying apt-get install slurm-wlm munge jq iproute2"
    if ! DEBIAN_FRONTEND=noninteractive timeout 60 apt-get install -y -q --no-install-recommends \
           slurm-wlm munge jq iproute2 >/dev/null 2>&1; then
      skip "missing $missing and apt-get install slurm-wlm munge failed"
    fi
    missing="$(missing_bins)"
    [[ -z "$missing" ]] || skip "still missing after install: $missing"
  fi
}

# Every process that belongs to this test carries our SLURM_CONF in its initial environment:
# munged excepted (started before the export, and stopped by pid), the daemons, srun,
# slurmstepd (forked by slurmd) and the tasks (srun propagates the environment). The sweep in
# teardown uses that to end stragglers by id without touching anything else on the machine.
# One grep over every /proc/*/environ (a fork per process is far too slow on a loaded
# machine); `env -u` keeps grep itself out of its own answer.
our_stragglers() {
  env -u SLURM_CONF grep -lszxF "SLURM_CONF=$T/slurm.conf" /proc/[0-9]*/environ 2>/dev/null |
    sed -n 's|^/proc/\([0-9]*\)/environ$|\1|p' || true
}

slurm_teardown() {
  local rc=$? pid i f
  set +e
  trap - EXIT INT TERM ERR
  if [[ $rc -ne 0 && $rc -ne 77 ]]; then
    for f in "$T"/*.out "$T"/*.log; do
      [[ -f "$f" ]] && { echo "---- $(basename "$f") (last 30 lines)"; tail -n 30 "$f"; }
    done
  fi
  # Cancel jobs first so slurmd tears the steps down in order, then stop the daemons.
  if [[ -f "$T/slurm.conf" ]]; then timeout 5 ${SLURM_CLIENT:-} scancel --quiet --user=root >/dev/null 2>&1; fi
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do kill -TERM "${pids[i]}" 2>/dev/null; done
  for _ in $(seq 50); do
    local alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [[ $alive -eq 0 ]] && break
    sleep 0.1
  done
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null; done
  for pid in $(our_stragglers); do kill -KILL "$pid" 2>/dev/null; done
  wait 2>/dev/null
  for f in "${ns_cleanup[@]}"; do eval "$f" 2>/dev/null; done
  if [[ "${GEOLOCO_SLURM_KEEP:-0}" == 1 ]]; then echo "slurm test: kept $T"; else rm -rf "$T"; fi
  exit "$rc"
}

slurm_install_teardown() {
  trap slurm_teardown EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
}

# munge: its own key, socket, pid, seed and log, all in $T; sets munge_sock.
slurm_start_munge() {
  dd if=/dev/urandom of="$T/munge.key" bs=1024 count=1 status=none
  chmod 400 "$T/munge.key"
  munge_sock="$T/munge.socket"
  munged --foreground --force --socket="$munge_sock" --key-file="$T/munge.key" \
         --pid-file="$T/munged.pid" --seed-file="$T/munged.seed" --log-file="$T/munged.log" \
         >"$T/munged.out" 2>&1 &
  pids+=($!)
  local i
  for i in $(seq 100); do
    munge -n -S "$munge_sock" >/dev/null 2>&1 && break
    kill -0 "${pids[0]}" 2>/dev/null || fail "munged exited: $(cat "$T/munged.out" "$T/munged.log" 2>/dev/null)"
    sleep 0.1
    [[ $i -eq 100 ]] && fail "munged did not answer within 10 s"
  done
}

# The slurm.conf lines every test's private cluster has (after its own host/port lines).
slurm_common_conf() {
  cat <<CONF
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=${munge_sock}
StateSaveLocation=$T/state
SlurmctldPidFile=$T/slurmctld.pid
SlurmctldLogFile=$T/slurmctld.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
SlurmdParameters=config_overrides
KillWait=2
MinJobAge=2
InactiveLimit=0
MailProg=/bin/true
CONF
}

# slurm_wait_ctld: slurmctld (the last daemon started) answers scontrol ping within 30 s.
slurm_wait_ctld() {
  local i last=$((${#pids[@]} - 1))
  for i in $(seq 150); do
    timeout 5 ${SLURM_CLIENT:-} scontrol ping 2>/dev/null | grep -q "is UP" && return 0
    kill -0 "${pids[last]}" 2>/dev/null || fail "slurmctld exited: $(cat "$T/slurmctld.out")"
    sleep 0.2
  done
  fail "slurmctld did not answer scontrol ping within 30 s"
}

# slurm_wait_idle NODE PID OUT: the node is idle within 30 s (its slurmd, PID, alive).
slurm_wait_idle() {
  local node=$1 pid=$2 out=$3 i state=""
  for i in $(seq 150); do
    state="$(timeout 5 ${SLURM_CLIENT:-} sinfo -h -n "$node" -o %t 2>/dev/null || true)"
    [[ "$state" == idle ]] && return 0
    kill -0 "$pid" 2>/dev/null || fail "slurmd of $node exited: $(cat "$out")"
    sleep 0.2
  done
  fail "node $node not idle within 30 s (state '$state')"
}

# run_srun SECONDS OUTFILE SRUN_ARGS...: sets rc. srun runs in the background and we `wait`
# for it, because bash defers INT/TERM traps until a foreground child returns: this way a
# signal to the test reaches teardown at once.
run_srun() {
  local limit=$1 out=$2
  shift 2
  timeout "$limit" ${SLURM_CLIENT:-} srun "$@" >"$out" 2>&1 &
  rc=0
  wait $! || rc=$?
}

# slurm_write_run NAME MODEL SITE: $T/run.yaml, one site "s" of 2 ranks (SITE: its mapping's
# other keys, e.g. "host: 127.0.0.1, port: 29500"), synthetic data, 10 steps, and its key
# $T/run.psk.
slurm_write_run() {
  cat >"$T/run.yaml" <<YAML
run: {name: $1, seed: 7, output_dir: $T/out}
model: $2
data:
  train: {kind: synthetic, vocab: 64, tokens: 65536}
train:
  steps: 10
  micro_batch: 2
  optimizer: {kind: adamw, lr: 1.0e-3}
  log_every: 5
  eval_batches: 1
sites:
  - {name: s, ranks: 2, $3}
transport: {psk_file: run.psk, timeout_s: 30}   # bounds the intra-site rendezvous too
YAML
  head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$T/run.psk"
  chmod 600 "$T/run.psk"
}

# slurm_check_site_run: $T/out/summary.json says the run completed, both Slurm tasks became
# distinct ranks of site s (SLURM_PROCID 0 -> s/0, 1 -> s/1), and the data-parallel replicas
# ended with identical parameters. Sets `summary`.
slurm_check_site_run() {
  summary="$T/out/summary.json"
  [[ -f "$summary" ]] || fail "no $summary"
  [[ "$(jq -r '.completed' "$summary")" == true ]] || fail "summary says completed != true"
  [[ "$(jq -c '[.ranks[] | [.site, .rank]]' "$summary")" == '[["s",0],["s",1]]' ]] ||
    fail "summary ranks $(jq -c '[.ranks[] | [.site, .rank]]' "$summary"), expected s/0 and s/1"
  [[ "$(jq -r '.ranks[0].params_hash' "$summary")" == "$(jq -r '.ranks[1].params_hash' "$summary")" ]] ||
    fail "ranks 0 and 1 ended with different params_hash"
}

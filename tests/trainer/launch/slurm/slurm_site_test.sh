#!/usr/bin/env bash
# Slurm integration test: brings up a private one-node Slurm (munged + slurmctld + slurmd, all
# in foreground mode under a temp dir, no systemd, nothing under /etc touched), then runs a
# 2-rank geoloco site with `srun -n 2` and checks the run's outputs. Also checks the failure
# path: `srun -n 3` against the same 2-rank config must fail with the worker's
# SLURM_NTASKS message instead of training.
#
#   tests/trainer/launch/slurm/slurm_site_test.sh path/to/geoloco
#
# Exit 0: pass. Exit 77: skipped (not root, or Slurm/munge missing and not installable), with
# a "SKIP: <reason>" line. Any other code: failure, with the daemons' logs printed.
# Every wait is bounded: at most 60 s of apt-get plus ~4 minutes worst case (10 + 30 + 30 s
# bring-up, 90 + 60 s of srun), inside ctest's 300 s; a normal pass takes 12-25 s.
# Set GEOLOCO_SLURM_NO_INSTALL=1 to skip instead of trying apt-get when binaries are missing.
# Set GEOLOCO_SLURM_KEEP=1 to keep the temp dir (daemon logs) for debugging.
set -Eeuo pipefail
# Name the command when `set -e` ends the test on something other than an explicit fail().
trap 'echo "FAIL: line $LINENO: \"$BASH_COMMAND\" exited with $?" >&2' ERR

[[ $# -eq 1 ]] || { echo "usage: $0 path/to/geoloco" >&2; exit 2; }
geoloco="$(readlink -f "$1")"
[[ -x "$geoloco" ]] || { echo "$0: $1 is not an executable" >&2; exit 2; }

# shellcheck source=slurm_lib.sh
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/slurm_lib.sh"
slurm_require

T="$(mktemp -d /tmp/geoloco-slurm.XXXXXX)"
chmod 700 "$T"
slurm_install_teardown

# Ports: one block of the tests' port allocator (tests/support/ports.sh: below the ephemeral
# range, locked for as long as this script and its daemons run), so concurrent tests
# (`ctest -j`) and concurrent runs of this test never get the same ports.
# shellcheck source=../../../support/ports.sh
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../../../support/ports.sh"
geoloco_claim_ports || fail "no free block of test ports"
ctld_port=$GEOLOCO_PORT_BASE
slurmd_port=$((GEOLOCO_PORT_BASE + 1))
srun_lo=$((GEOLOCO_PORT_BASE + 2))     # 8 ports: srun_lo .. srun_lo + 7
site_port=$((GEOLOCO_PORT_BASE + 10))  # rank r on port+r, the site's store on port+2

# slurmctld recognises itself by the short host name (gethostname up to the first dot).
node="$(uname -n)"
node="${node%%.*}"
mkdir -p "$T/state" "$T/spool" "$T/out"

slurm_start_munge

# 4 CPUs declared whatever the machine has (config_overrides), so 2 or 3 tasks fit even on a
# 1-CPU runner; srun also gets --overcommit. Addresses are 127.0.0.1 so the test does not
# depend on how the host name resolves.
cat >"$T/slurm.conf" <<CONF
ClusterName=geoloco-test
SlurmctldHost=${node}(127.0.0.1)
SlurmctldPort=${ctld_port}
SlurmdPort=${slurmd_port}
SrunPortRange=${srun_lo}-$((srun_lo + 7))
SlurmdSpoolDir=$T/spool
SlurmdPidFile=$T/slurmd.pid
SlurmdLogFile=$T/slurmd.log
$(slurm_common_conf)
NodeName=${node} NodeAddr=127.0.0.1 CPUs=4 State=UNKNOWN
PartitionName=debug Nodes=${node} Default=YES MaxTime=10 State=UP
CONF
export SLURM_CONF="$T/slurm.conf"

slurmctld -D -c >"$T/slurmctld.out" 2>&1 &
pids+=($!)
slurm_wait_ctld

slurmd -D -N "$node" >"$T/slurmd.out" 2>&1 &
pids+=($!)
slurm_wait_idle "$node" "${pids[2]}" "$T/slurmd.out"
echo "slurm test: node $node idle (slurmctld :$ctld_port, slurmd :$slurmd_port)"

# One site "s" of 2 ranks, synthetic data, 10 steps: a few seconds on 2 cores.
slurm_write_run slurm-site "{n_layer: 1, n_head: 2, n_embd: 32, block_size: 32, vocab_size: 64}" \
  "host: 127.0.0.1, port: ${site_port}"

# --- the run: 2 Slurm tasks = site s, ranks 0 and 1 (from SLURM_PROCID) ---------------------
run_srun 90 "$T/srun.out" -n 2 --overcommit --kill-on-bad-exit=1 --time=2 -J geoloco-slurm-test \
  --chdir="$T" "$geoloco" worker "$T/run.yaml"
sed 's/^/  srun| /' "$T/srun.out"
[[ $rc -eq 0 ]] || fail "srun -n 2 exited with $rc"

slurm_check_site_run
ws="$(jq -r .world_size "$summary")"
steps="$(jq -r .steps "$summary")"
[[ "$ws" == 2 ]] || fail "summary world_size $ws, expected 2"
[[ "$steps" == 10 ]] || fail "summary steps $steps, expected 10"
for r in 0 1; do
  f="$T/out/sites/s/rank$r.json"
  [[ -f "$f" ]] || fail "no $f"
  [[ "$(jq -r .steps "$f")" == 10 ]] || fail "$f: steps $(jq -r .steps "$f"), expected 10"
done
echo "slurm test: srun -n 2 ok (world_size 2, 10 steps, rank0.json and rank1.json)"

# --- failure path: 3 tasks for a 2-rank config must be refused by every task --------------
rm -rf "$T/out"
run_srun 60 "$T/srun_bad.out" -n 3 --overcommit --kill-on-bad-exit=1 --time=1 -J geoloco-slurm-bad \
  --chdir="$T" "$geoloco" worker "$T/run.yaml"
sed 's/^/  srun(bad)| /' "$T/srun_bad.out"
[[ $rc -ne 0 && $rc -ne 124 ]] || fail "srun -n 3 on a 2-rank config exited with $rc, expected a refusal"
grep -q "SLURM_NTASKS" "$T/srun_bad.out" || fail "srun -n 3: no SLURM_NTASKS message in the output"
[[ ! -e "$T/out/summary.json" ]] || fail "srun -n 3 wrote a summary.json"
echo "slurm test: srun -n 3 refused (SLURM_NTASKS mismatch), rc $rc"

echo "slurm test: PASS"

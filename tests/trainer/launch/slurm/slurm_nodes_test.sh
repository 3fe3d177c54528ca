#!/usr/bin/env bash
# Slurm across nodes: one geoloco site whose two ranks run on two Slurm nodes. The nodes are
# network namespaces on a bridge (198.19.200.0/24, this test's own), each running its own
# slurmd (`slurmd -N gn<k>`); slurmctld and the clients (sinfo, srun) run in a third namespace
# on the same bridge; munged's socket is a file, shared by all. Then
#   srun --nodes=2 --ntasks-per-node=1 geoloco worker run.yaml --set sites.0.host=n0 --set sites.0.nodes=2
# must put rank 0 on gn0 and rank 1 on gn1 (SLURM_PROCID -> rank), rank 1 must find gn1's
# address itself (the config names only node 0's), and the site's collectives
# must cross between the nodes: the run completes with both ranks on one parameter hash, and
# gn1's interface carried at least a model's worth of bytes per inner step.
#
#   tests/trainer/launch/slurm/slurm_nodes_test.sh path/to/geoloco
#
# Exit 0: pass; 77: skipped (not root, no `ip netns`, Slurm/munge missing), reason printed;
# anything else: failure, with the daemons' logs. Every wait is bounded (see slurm_lib.sh).
set -Eeuo pipefail
trap 'echo "FAIL: line $LINENO: \"$BASH_COMMAND\" exited with $?" >&2' ERR

[[ $# -eq 1 ]] || { echo "usage: $0 path/to/geoloco" >&2; exit 2; }
geoloco="$(readlink -f "$1")"
[[ -x "$geoloco" ]] || { echo "$0: $1 is not an executable" >&2; exit 2; }

# shellcheck source=slurm_lib.sh
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/slurm_lib.sh"
slurm_require ip nsenter
ip netns list >/dev/null 2>&1 || skip "'ip netns' does not work here"

T="$(mktemp -d /tmp/geoloco-slurm-nodes.XXXXXX)"
chmod 700 "$T"
slurm_install_teardown

# shellcheck source=../../../support/ports.sh
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../../../support/ports.sh"
geoloco_claim_ports || fail "no free block of test ports"
ctld_port=$GEOLOCO_PORT_BASE
slurmd_port=$((GEOLOCO_PORT_BASE + 1))
srun_lo=$((GEOLOCO_PORT_BASE + 2))     # 8 ports
site_port=$((GEOLOCO_PORT_BASE + 10))  # rank r on port+r, the site's store on port+2

# The namespaces: ctl (bridge br0 at .1) and the nodes n0 (.2), n1 (.3).
pfx="gls$$"
ctl="$pfx-ctl"
net=198.19.200
ns_cleanup+=("ip netns del $ctl" "ip netns del $pfx-n0" "ip netns del $pfx-n1")
ip netns add "$ctl"
ip -n "$ctl" link set lo up
ip -n "$ctl" link add br0 type bridge
ip -n "$ctl" addr add "$net.1/24" dev br0
ip -n "$ctl" link set br0 up
for k in 0 1; do
  ip netns add "$pfx-n$k"
  ip -n "$pfx-n$k" link set lo up
  ip -n "$ctl" link add "n$k" type veth peer name eth0 netns "$pfx-n$k"
  ip -n "$ctl" link set "n$k" master br0
  ip -n "$ctl" link set "n$k" up
  ip -n "$pfx-n$k" addr add "$net.$((k + 2))/24" dev eth0
  ip -n "$pfx-n$k" link set eth0 up
done
for k in 0 1; do
  for _ in $(seq 100); do
    [[ "$(ip netns exec "$pfx-n$k" cat /sys/class/net/eth0/operstate 2>/dev/null)" == up ]] && break
    sleep 0.05
  done
done
# nsenter, not `ip netns exec`: that one remounts /sys for the namespace, and slurmd then finds
# no /sys/fs/cgroup ("Unable to initialize cgroup plugin").
in_ns() { local ns=$1; shift; nsenter --net="/run/netns/$ns" "$@"; }
export SLURM_CLIENT="nsenter --net=/run/netns/$ctl"

node="$(uname -n)"
node="${node%%.*}"
mkdir -p "$T/state" "$T/out" "$T/spool-gn0" "$T/spool-gn1"
slurm_start_munge

# Two nodes of one host name told apart by NodeName (slurmd -N) and address; per-node spool,
# pid and log files (%n: the node name).
cat >"$T/slurm.conf" <<CONF
ClusterName=geoloco-nodes-test
SlurmctldHost=${node}($net.1)
SlurmctldPort=${ctld_port}
SlurmdPort=${slurmd_port}
SrunPortRange=${srun_lo}-$((srun_lo + 7))
SlurmdSpoolDir=$T/spool-%n
SlurmdPidFile=$T/slurmd-%n.pid
SlurmdLogFile=$T/slurmd-%n.log
$(slurm_common_conf)
NodeName=gn0 NodeHostname=${node} NodeAddr=$net.2 CPUs=2 State=UNKNOWN
NodeName=gn1 NodeHostname=${node} NodeAddr=$net.3 CPUs=2 State=UNKNOWN
PartitionName=debug Nodes=gn0,gn1 Default=YES MaxTime=10 State=UP
CONF
export SLURM_CONF="$T/slurm.conf"

in_ns "$ctl" slurmctld -D -c >"$T/slurmctld.out" 2>&1 &
pids+=($!)
slurm_wait_ctld
for k in 0 1; do
  in_ns "$pfx-n$k" slurmd -D -N "gn$k" >"$T/slurmd-gn$k.out" 2>&1 &
  pids+=($!)
done
slurm_wait_idle gn0 "${pids[2]}" "$T/slurmd-gn0.out"
slurm_wait_idle gn1 "${pids[3]}" "$T/slurmd-gn1.out"
echo "slurm nodes test: gn0 ($net.2) and gn1 ($net.3) idle"

# Where Slurm puts the tasks: one per node, in task order.
run_srun 60 "$T/where.out" --nodes=2 --ntasks-per-node=1 -n 2 --overcommit --time=1 -J geoloco-where \
  sh -c 'echo "task $SLURM_PROCID on $SLURMD_NODENAME"'
cat "$T/where.out"
[[ $rc -eq 0 ]] || fail "srun --nodes=2 (where) exited with $rc"
grep -qx "task 0 on gn0" "$T/where.out" || fail "task 0 is not on gn0"
grep -qx "task 1 on gn1" "$T/where.out" || fail "task 1 is not on gn1"

# One site "s" of 2 ranks, one per node (nodes: 2): rank 0 at gn0's address, the one the config
# gives; rank 1 finds gn1's (the interface that reaches gn0).
slurm_write_run slurm-nodes "{n_layer: 2, n_head: 2, n_embd: 64, block_size: 32, vocab_size: 64}" \
  "port: ${site_port}"

before="$(ip -n "$pfx-n1" -s -j link show eth0 | jq '.[0].stats64.tx.bytes + .[0].stats64.rx.bytes')"
run_srun 90 "$T/srun.out" --nodes=2 --ntasks-per-node=1 -n 2 --overcommit --kill-on-bad-exit=1 --time=2 \
  -J geoloco-slurm-nodes --chdir="$T" "$geoloco" worker "$T/run.yaml" --set "sites.0.host=$net.2" \
  --set sites.0.nodes=2
sed 's/^/  srun| /' "$T/srun.out"
[[ $rc -eq 0 ]] || fail "srun --nodes=2 exited with $rc"
grep -q "2 ranks on 2 nodes at $net.2, $net.3" "$T/srun.out" || fail "rank 1 did not bind gn1's address ($net.3)"
after="$(ip -n "$pfx-n1" -s -j link show eth0 | jq '.[0].stats64.tx.bytes + .[0].stats64.rx.bytes')"

slurm_check_site_run
# Gloo's all-reduce of the gradient every step crossed gn1's link: at least half the model's
# fp32 bytes per inner step (10 steps).
params="$(jq -r '.params' "$summary")"
crossed=$((after - before))
need=$((params * 4 / 2 * 10))
echo "slurm nodes test: gn1's link carried $crossed bytes during the run (model $((params * 4)) bytes, 10 steps)"
((crossed > need)) || fail "gn1's link carried $crossed bytes, expected more than $need"
echo "slurm nodes test: PASS"

#!/usr/bin/env bash
# `geoloco launch` on a terminal, looked at as a person would, in tmux (send-keys,
# capture-pane): one status line per site that updates in place while log lines scroll above
# it; a failing rank's error is readable in full; the screen is left clean at the end.
#   status_view_tmux.sh BUILD_DIR
set -euo pipefail
build="$(readlink -f "$1")"
here="$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")"
command -v tmux > /dev/null || { echo "status_view_tmux: FAIL: tmux not found (tools/setup.sh installs it)" >&2; exit 1; }
tmp="$(mktemp -d /tmp/geoloco-status-view-XXXXXX)"
sock="geoloco-sv-$$"
cleanup() { tmux -L "$sock" kill-server 2> /dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
fail() {
  echo "status_view_tmux: FAIL: $*" >&2
  echo "--- screen:" >&2
  tmux -L "$sock" capture-pane -p -t sv 2> /dev/null >&2 || true
  exit 1
}
# shellcheck source=../../support/ports.sh
source "$here/../../support/ports.sh"
geoloco_claim_ports || fail "no free port block"
port=$GEOLOCO_PORT_BASE
printf '0123456789abcdef-test-key' > "$tmp/k.psk"
config() {  # config NAME STEPS
  cat > "$tmp/$1.yaml" <<YAML
run: {name: $1, seed: 7, output_dir: $tmp/$1}
model: {n_layer: 1, n_head: 2, n_embd: 32, block_size: 16, vocab_size: 64}
data:
  train: {kind: synthetic, vocab: 64, branching: 3, seed: 5}
train: {steps: $2, micro_batch: 2, log_every: 5, eval_every: 50}
outer: {interval: 20, compression: {codec: int8}}
sites:
  - {name: paris, ranks: 1, port: $port}
  - {name: lyon, ranks: 1, port: $((port + 10))}
transport: {psk_file: k.psk, connect_timeout_s: 20, emulate: {delay_ms: 150}}
YAML
}
screen() { tmux -L "$sock" capture-pane -p -t sv; }
wait_for() {  # wait_for REGEX SECONDS
  local until=$((SECONDS + $2))
  while ((SECONDS < until)); do
    screen | grep -Eq "$1" && return 0
    sleep 0.2
  done
  return 1
}
block_re='^(paris|lyon) +step [0-9]+/[0-9]+ \['

# 1. A run that finishes.
config ok 240
tmux -L "$sock" new-session -d -s sv -x 160 -y 40
tmux -L "$sock" send-keys -t sv "cd $tmp && $build/geoloco launch ok.yaml; echo EXIT=\$?" Enter
wait_for '^paris +step [0-9]+/240' 60 || fail "no status line for paris"
steps=()
for _ in 1 2 3 4 5 6; do
  s="$(screen)"
  n_paris="$(grep -Ec '^paris +step [0-9]+/240' <<< "$s" || true)"
  n_lyon="$(grep -Ec '^lyon +step [0-9]+/240' <<< "$s" || true)"
  if grep -q "^EXIT=[0-9]" <<< "$s"; then break; fi
  [[ "$n_paris" -le 1 && "$n_lyon" -le 1 ]] || fail "the block is drawn more than once ($n_paris paris, $n_lyon lyon lines)"
  steps+=("$(grep -Eo '^paris +step [0-9]+' <<< "$s" | grep -Eo '[0-9]+$' || true)")
  sleep 0.7
done
distinct="$(printf '%s\n' "${steps[@]}" | { grep -v '^$' || true; } | sort -u | wc -l)"
((distinct >= 2)) || fail "paris's status line did not update (steps seen: ${steps[*]})"
wait_for '^EXIT=0' 90 || fail "the run did not finish with exit 0"
s="$(screen)"
grep -Eq "$block_re" <<< "$s" && fail "the status block is left on the screen after the run"
grep -q "geoloco: run 'ok' finished" <<< "$s" || fail "no summary at the end"
grep -q "outer step" <<< "$s" || fail "log lines did not scroll above the block"
echo "status_view_tmux: block updated (paris steps ${steps[*]}), screen clean at the end"

# 2. A rank that dies mid-run: its error is readable, the block is gone.
config dies 100000
tmux -L "$sock" send-keys -t sv "clear; $build/geoloco launch dies.yaml; echo EXIT=\$?" Enter
wait_for '^lyon +step [0-9]+/100000' 60 || fail "no status line for lyon"
pkill -KILL -f "worker dies.yaml --site lyon" || fail "no lyon worker to kill"
wait_for '^EXIT=[0-9]' 60 || fail "the launcher did not exit after a rank died"
s="$(screen)"
grep -q '^EXIT=1' <<< "$s" || fail "exit status is not 1"
grep -q '\[launch\] rank lyon/0 was killed by signal 9 (SIGKILL' <<< "$s" || fail "the failing rank's error is not readable"
grep -Eq "$block_re" <<< "$s" && fail "the status block is left on the screen after the failure"
echo "status_view_tmux: a killed rank is named in full, screen clean"

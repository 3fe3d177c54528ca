# tests/support/ports.sh: the shell side of tests/support/ports.hpp (same lock directory,
# lock-file names and block geometry: change both together). Source it, then
#
#   geoloco_claim_ports || fail "no free port block"
#   port=$GEOLOCO_PORT_BASE        # ports $GEOLOCO_PORT_BASE .. + $GEOLOCO_PORT_BLOCK - 1
#
# The block is this shell's while it runs: the flock(2) on the block's lock file is held by
# descriptor $GEOLOCO_PORT_LOCK_FD, which the kernel closes when the shell (and every child
# that inherited it) has exited. A block is taken only when no TCP socket of this network
# namespace uses any of its ports (ss), the shell's stand-in for ports.cpp's bind check.
# GEOLOCO_TEST_PORT_{DIR,FIRST,END,BLOCK} override the pool (its unit test uses a private one).

geoloco_claim_ports() {
  local dir="${GEOLOCO_TEST_PORT_DIR:-/tmp/geoloco-test-ports}"
  local first="${GEOLOCO_TEST_PORT_FIRST:-20000}" end="${GEOLOCO_TEST_PORT_END:-0}"
  local block="${GEOLOCO_TEST_PORT_BLOCK:-64}"
  local lo hi
  if ((end == 0)); then
    end=32768
    if read -r lo hi </proc/sys/net/ipv4/ip_local_port_range && ((lo > 0 && lo < end)); then end=$lo; fi
  fi
  local blocks=$(((end - first) / block))
  if ((blocks <= 0)); then
    echo "geoloco_claim_ports: no room for a block of $block in $first..$((end - 1))" >&2
    return 1
  fi
  if [[ ! -d "$dir" ]]; then mkdir -m 1777 -p "$dir" 2>/dev/null || [[ -d "$dir" ]] || return 1; fi
  # Local ports of every TCP socket (listening, connected, TIME_WAIT) of this namespace.
  local used
  used="$({ ss -Htan 2>/dev/null || true; } | awk '{ sub(/.*:/, "", $4); print $4 }')"
  local k base fd start=$(($$ % blocks))
  for ((k = 0; k < blocks; k++)); do
    base=$((first + ((start + k) % blocks) * block))
    exec {fd}>>"$dir/$base" || continue
    if flock -n -x "$fd"; then
      if ! awk -v lo="$base" -v hi="$((base + block))" '$1 >= lo && $1 < hi { busy = 1 } END { exit !busy }' \
             <<<"$used"; then
        GEOLOCO_PORT_BASE=$base
        GEOLOCO_PORT_BLOCK=$block
        GEOLOCO_PORT_LOCK_FD=$fd
        return 0
      fi
    fi
    exec {fd}>&-
  done
  echo "geoloco_claim_ports: every block of $first..$((end - 1)) (locks in $dir) is taken or in use" >&2
  return 1
}

#!/usr/bin/env bash
# The owner exchange against all-to-all through real TCP: three sites in network namespaces
# behind tools/wan's continental-3site-1g scenario (1500/2500/4000 km triangle, 1 Gbit/s per
# link, kernel TCP), the real outer loop at 45M parameters behind the rehearsal's stand-in
# inner loop (train.rehearsal: 0.2 s steps, no model compute), int4 + error feedback, H = 10,
# 60 steps (6 blocking rounds). Root only (namespaces). Alternated within each run r:
# all_to_all, owner. Per run: the sites' mean steady-state sync time (rounds 2-6: the first
# pays first-touch costs) and each site's bytes sent per round (transport counters).
#
#   bench/exchange/wan.sh [--allow-load] [path/to/geoloco]     (default: build/geoloco)
#
# Environment: bench/lib.sh's (BENCH_RUNS >= 5, load gate), KEEP=1. Prints ONE JSON document
# (results/exchange-wan.json keeps the quoted one).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
source "$root/bench/lib.sh"
bench_init "$@"
set -- "${bench_args[@]}"
geoloco="$(readlink -f "${1:-$root/build/geoloco}")"
[[ -x "$geoloco" ]] || { echo "wan.sh: no geoloco binary at $geoloco (build it, or pass its path)" >&2; exit 2; }
[[ "$(id -u)" == 0 ]] || { echo "wan.sh: needs root (network namespaces)" >&2; exit 2; }

out="$(mktemp -d /tmp/geoloco-bench-exchange-wan.XXXXXX)"
cleanup() { if [[ "${KEEP:-0}" == 1 ]]; then echo "wan.sh: kept $out" >&2; else rm -rf "$out"; fi; }
trap cleanup EXIT
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$out/k.psk"
for ex in all_to_all owner; do
  cat >"$out/$ex.yaml" <<YAML
run: {name: exchange-wan, seed: 1, output_dir: $out/run}
model: {n_layer: 6, n_head: 8, n_embd: 512, block_size: 512, vocab_size: 50257}
data:
  train: {kind: synthetic, vocab: 50257, tokens: 4194304}
train:
  steps: 60
  log_every: 10
  checkpoint_every: 0
  rehearsal: {step_seconds: 0.2, drift: 1.0e-5}
sites:
  - {name: west, ranks: 1, port: 29500}
  - {name: center, ranks: 1, port: 29510}
  - {name: east, ranks: 1, port: 29520}
outer:
  interval: 10
  min_sites: 3
  exchange: $ex
  compression: {codec: int4, block: 128, error_feedback: true, zstd_level: 0}
transport: {psk_file: k.psk, timeout_s: 300}
YAML
done

for ((r = 1; r <= BENCH_RUNS; ++r)); do
  for ex in all_to_all owner; do
    echo "wan.sh: $ex run $r" >&2
    GEOLOCO_BIN="$geoloco" "$root/tools/wan/run" --timeout 600 --output-dir "$out/$ex-$r" \
      "$root/configs/wan/continental-3site-1g.yaml" "$out/$ex.yaml" >"$out/$ex-$r.log" 2>&1 ||
      { echo "wan.sh: $ex run $r failed:" >&2; tail -30 "$out/$ex-$r.log" >&2; exit 1; }
    rm -rf "$out/$ex-$r/checkpoints"
  done
done
bench_finish
python3 - "$out" <<'PY'
import glob, json, os, statistics, sys
import benchlib
out = sys.argv[1]
rows = {}
for f in sorted(glob.glob(os.path.join(out, "*-*", "summary.json"))):
    ex = os.path.basename(os.path.dirname(f)).rsplit("-", 1)[0]
    s = json.load(open(f))
    assert len({r["global_weights_hash"] for r in s["ranks"]}) == 1, f + ": the sites disagree"
    rows.setdefault(ex, []).append({
        "sync_s": statistics.mean(statistics.mean(r["sync_seconds"][1:]) for r in s["ranks"]),
        "bytes": statistics.mean(r["wan_bytes_sent"] / s["outer_steps"] for r in s["ranks"]),
    })
fig = {ex: {"sync_s": benchlib.spread([r["sync_s"] for r in rs], 4),
            "bytes_per_site_per_round": benchlib.spread([r["bytes"] for r in rs], 0)} for ex, rs in rows.items()}
print(json.dumps({
    "benchmark": "exchange-wan",
    "setting": "3 sites x 1 rank in namespaces, tools/wan continental-3site-1g (1500/2500/4000 km, 1 Gbit/s, "
               "real TCP), 45M-parameter rehearsal (0.2 s stand-in steps), int4 + error feedback, H 10, 60 steps, "
               "blocking; sync time: rounds 2-6, mean over the sites",
    "geoloco": {"config": "outer.exchange: owner", **fig["owner"]},
    "peer": {"config": "outer.exchange: all_to_all", **fig["all_to_all"]},
    "ratio": {"sync_s": round(fig["owner"]["sync_s"]["median"] / fig["all_to_all"]["sync_s"]["median"], 3),
              "bytes_per_site_per_round": round(fig["owner"]["bytes_per_site_per_round"]["median"] /
                                                fig["all_to_all"]["bytes_per_site_per_round"]["median"], 4)},
    **benchlib.load_record(),
}, indent=2))
PY

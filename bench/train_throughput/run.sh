#!/usr/bin/env bash
# Training throughput: geoloco's CPU GPT-2 step vs PyTorch's on the same config and
# thread count. Prints one JSON document:
#   {geoloco_tokens_per_s, pytorch_tokens_per_s, ratio, config..., load_before, load_after,
#    loaded, geoloco: {...}, pytorch: {...}}
#
#   bench/train_throughput/run.sh [--allow-load] [--n_layer 2 --n_head 4 --n_embd 128 --block_size 64
#                                  --vocab_size 256 --batch 8 --seq 64 --steps 50 --warmup 5
#                                  --threads 1 --seed 1]
# Every flag but --allow-load goes unchanged to both programs. The discipline of bench/lib.sh:
# refuses to start above load average 1.0 unless --allow-load (then "loaded": true), runs
# geoloco and PyTorch alternately BENCH_RUNS times (5), reports medians with min and max.
# Environment:
#   GEOLOCO_BENCH_BIN   the geoloco step benchmark (default: $GEOLOCO_BUILD_DIR/bench/train_throughput/bench_model_step,
#                       GEOLOCO_BUILD_DIR defaulting to build/); the integrator may point it at `geoloco train`.
#   BENCH_OPENBLAS_CORETYPE  OpenBLAS kernels for BOTH programs (Debian's PyTorch links the same
#                       OpenBLAS): 'auto' (default: SkylakeX when the CPU has AVX-512, else whatever
#                       OPENBLAS_CORETYPE says), 'inherit', or a core name.
#   BENCH_RUNS, BENCH_MAX_LOAD, BENCH_ALLOW_LOAD: see bench/lib.sh.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
bin="${GEOLOCO_BENCH_BIN:-${GEOLOCO_BUILD_DIR:-$root/build}/bench/train_throughput/bench_model_step}"
[[ -x "$bin" ]] || { echo "run.sh: no benchmark binary at $bin (build target bench_model_step)" >&2; exit 2; }
source "$root/bench/lib.sh"
bench_init "$@"

threads=1
args=("${bench_args[@]}")
for ((i = 0; i < ${#args[@]}; ++i)); do
  [[ "${args[i]}" == --threads ]] && threads="${args[i + 1]}"
done

# One thread per library, no busy-waiting pools fighting over a shared core.
export OMP_NUM_THREADS="$threads" OPENBLAS_NUM_THREADS="$threads" MKL_NUM_THREADS="$threads"
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"

coretype="${BENCH_OPENBLAS_CORETYPE:-auto}"
blas_env=()
case "$coretype" in
  inherit) ;;
  auto) grep -qw avx512f /proc/cpuinfo && grep -qw avx512bw /proc/cpuinfo && blas_env=(OPENBLAS_CORETYPE=SkylakeX) ;;
  *) blas_env=(OPENBLAS_CORETYPE="$coretype") ;;
esac

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
for ((r = 0; r < BENCH_RUNS; ++r)); do
  env "${blas_env[@]}" "$bin" "${args[@]}" > "$tmp/geoloco.$r.json"
  env "${blas_env[@]}" /usr/bin/python3 "$here/torch_gpt.py" "${args[@]}" > "$tmp/pytorch.$r.json"
done
bench_finish

/usr/bin/python3 - "$tmp" "$BENCH_RUNS" <<'PY'
import json, statistics, sys
import benchlib
tmp, n = sys.argv[1], int(sys.argv[2])
def load(name):
    return [json.load(open(f"{tmp}/{name}.{r}.json")) for r in range(n)]
def median_run(runs):
    # the run whose tokens_per_s is the (lower) median, with every run's figures beside it
    order = sorted(runs, key=lambda d: d["tokens_per_s"])
    m = dict(order[(len(order) - 1) // 2])
    m["tokens_per_s_runs"] = benchlib.spread([d["tokens_per_s"] for d in runs], 1)
    m["tokens_per_cpu_s_runs"] = benchlib.spread([d["tokens_per_cpu_s"] for d in runs], 1)
    return m
gr, pr = load("geoloco"), load("pytorch")
g, p = median_run(gr), median_run(pr)
gm = statistics.median(d["tokens_per_s"] for d in gr)
pm = statistics.median(d["tokens_per_s"] for d in pr)
keys = ["threads", "n_layer", "n_head", "n_embd", "block_size", "vocab_size", "batch", "seq", "steps"]
out = {"bench": "train_throughput",
       "geoloco_tokens_per_s": round(gm, 1), "pytorch_tokens_per_s": round(pm, 1),
       "ratio": round(gm / pm, 3),  # median over median
       # each alternated pair (geoloco run r / PyTorch run r): the spread of the ratio itself
       "ratio_per_pair": benchlib.spread([a["tokens_per_s"] / b["tokens_per_s"] for a, b in zip(gr, pr)], 3),
       # per CPU-second of each process: less sensitive to waiting than wall time
       "ratio_cpu": round(statistics.median(d["tokens_per_cpu_s"] for d in gr) /
                          statistics.median(d["tokens_per_cpu_s"] for d in pr), 3),
       "n_params": g["n_params"], "pytorch_n_params": p["n_params"]}
out.update(benchlib.load_record())
out.update({k: g[k] for k in keys})
out["geoloco"], out["pytorch"] = g, p
print(json.dumps(out, indent=1))
PY

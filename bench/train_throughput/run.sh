#!/usr/bin/env bash
# Training throughput: geoloco's CPU GPT-2 step vs PyTorch's on the same config and
# thread count. Prints one JSON document:
#   {geoloco_tokens_per_s, pytorch_tokens_per_s, ratio, config..., geoloco: {...}, pytorch: {...}}
#
#   bench/train_throughput/run.sh [--n_layer 2 --n_head 4 --n_embd 128 --block_size 64
#                                  --vocab_size 256 --batch 8 --seq 64 --steps 50 --warmup 5
#                                  --threads 1 --seed 1]
# Every flag goes unchanged to both programs. Environment:
#   GEOLOCO_BENCH_BIN   the geoloco step benchmark (default: $GEOLOCO_BUILD_DIR/bench/train_throughput/bench_model_step,
#                       GEOLOCO_BUILD_DIR defaulting to build/); the integrator may point it at `geoloco train`.
#   BENCH_OPENBLAS_CORETYPE  OpenBLAS kernels for BOTH programs (Debian's PyTorch links the same
#                       OpenBLAS): 'auto' (default: SkylakeX when the CPU has AVX-512, else whatever
#                       OPENBLAS_CORETYPE says), 'inherit', or a core name.
#   BENCH_REPEATS       runs of each program, alternating; the best of each is reported (default 3:
#                       shared machines are noisy and both sides get the same chance).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
bin="${GEOLOCO_BENCH_BIN:-${GEOLOCO_BUILD_DIR:-$root/build}/bench/train_throughput/bench_model_step}"
[[ -x "$bin" ]] || { echo "run.sh: no benchmark binary at $bin (build target bench_model_step)" >&2; exit 2; }

threads=1
args=("$@")
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

repeats="${BENCH_REPEATS:-3}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
for ((r = 0; r < repeats; ++r)); do
  env "${blas_env[@]}" "$bin" "${args[@]}" > "$tmp/geoloco.$r.json"
  env "${blas_env[@]}" /usr/bin/python3 "$here/torch_gpt.py" "${args[@]}" > "$tmp/pytorch.$r.json"
done

/usr/bin/python3 - "$tmp" "$repeats" <<'PY'
import json, sys
tmp, n = sys.argv[1], int(sys.argv[2])
def load(name):
    return [json.load(open(f"{tmp}/{name}.{r}.json")) for r in range(n)]
def best(runs):
    b = dict(max(runs, key=lambda d: d["tokens_per_s"]))
    b["all_tokens_per_s"] = [round(d["tokens_per_s"], 1) for d in runs]
    return b
gr, pr = load("geoloco"), load("pytorch")
g, p = best(gr), best(pr)
keys = ["threads", "n_layer", "n_head", "n_embd", "block_size", "vocab_size", "batch", "seq", "steps"]
out = {"bench": "train_throughput", "geoloco_tokens_per_s": round(g["tokens_per_s"], 1),
       "pytorch_tokens_per_s": round(p["tokens_per_s"], 1),
       "ratio": round(g["tokens_per_s"] / p["tokens_per_s"], 3),
       # per CPU-second of each process (best run of each): steadier than wall time on a busy machine
       "ratio_cpu": round(max(d["tokens_per_cpu_s"] for d in gr) / max(d["tokens_per_cpu_s"] for d in pr), 3),
       "n_params": g["n_params"], "pytorch_n_params": p["n_params"],
       # other work on the machine during the runs: figures from a busy machine are low on both sides
       "loadavg_1min_after": float(open("/proc/loadavg").read().split()[0])}
out.update({k: g[k] for k in keys})
out["geoloco"], out["pytorch"] = g, p
print(json.dumps(out, indent=1))
PY

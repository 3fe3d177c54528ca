"""bench/benchlib.py: the JSON half of bench/lib.sh (read that file first).

load_record()  the fields every timed benchmark's JSON carries: load averages before and
               after, the threshold, whether the run was loaded, how many runs.
spread(xs)     median, min, max and every value of one figure over the alternated runs.

Importable from any bench script that sourced lib.sh (it puts bench/ on PYTHONPATH).
"""
import os
import statistics


def _loadavg(text):
    return [float(x) for x in text.split()[:3]] if text else None


def load_record(runs=None):
    """runs: how many times each configuration ran, when not BENCH_RUNS (a benchmark without a
    peer run, e.g. bench/budget, measures each point once)."""
    before = os.environ.get("BENCH_LOAD_BEFORE")
    if before is None:
        raise SystemExit("benchlib: BENCH_LOAD_BEFORE is not set: the script must call bench_init (bench/lib.sh)")
    after = os.environ.get("BENCH_LOAD_AFTER")
    if after is None:
        with open("/proc/loadavg") as f:
            after = " ".join(f.read().split()[:3])
    return {
        "load_before": _loadavg(before),
        "load_after": _loadavg(after),
        "max_load": float(os.environ.get("BENCH_MAX_LOAD", "1.0")),
        # true: started above max_load with --allow-load; the figures are not comparable
        "loaded": os.environ.get("BENCH_LOADED") == "1",
        "runs": runs if runs is not None else int(os.environ.get("BENCH_RUNS", "0")),
        "nproc": os.cpu_count(),
    }


def spread(values, digits=None):
    """{"median", "min", "max", "all"} of a figure over the runs (in run order in "all")."""
    xs = [float(v) for v in values]
    if not xs:
        raise ValueError("spread of no values")
    r = (lambda v: round(v, digits)) if digits is not None else (lambda v: v)
    return {"median": r(statistics.median(xs)), "min": r(min(xs)), "max": r(max(xs)), "all": [r(v) for v in xs]}

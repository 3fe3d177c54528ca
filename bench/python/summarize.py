"""bench/python/run.sh's JSON: per size, the native and the package outer loop's mean sync time
and exposed wait (each run: the mean over the ranks), medians over the runs, and the ratios."""

import glob
import json
import os
import platform
import sys

import benchlib


def per_run(path):
    s = json.load(open(path))
    ranks = s.get("ranks", [s])
    sync = sum(r["sync_seconds_mean"] for r in ranks) / len(ranks)
    wait = sum(r["exposed_wait_s"] for r in ranks) / len(ranks)
    return sync, wait, s["params"]


def cpu_name():
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def main():
    out, sizes = sys.argv[1], sys.argv[2:]
    doc = {"bench": "python_package_outer_loop", "cpu": cpu_name(), **benchlib.load_record(), "sizes": []}
    for m in sizes:
        row = {"size_m": int(m)}
        for side in ("native", "package"):
            runs = [per_run(p) for p in sorted(glob.glob(os.path.join(out, f"{side}-{m}.r*.json")))]
            row["params"] = runs[0][2]
            row[f"{side}_sync_s"] = benchlib.spread([r[0] for r in runs], 4)
            row[f"{side}_exposed_wait_s"] = benchlib.spread([r[1] for r in runs], 4)
        row["sync_ratio_package_over_native"] = round(row["package_sync_s"]["median"] / row["native_sync_s"]["median"], 3)
        row["wait_ratio_package_over_native"] = round(
            row["package_exposed_wait_s"]["median"] / max(row["native_exposed_wait_s"]["median"], 1e-9), 3)
        doc["sizes"].append(row)
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()

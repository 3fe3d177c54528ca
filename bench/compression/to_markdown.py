#!/usr/bin/env python3
"""Turns bench_codecs JSON (stdin or a file) into the markdown tables of docs/compression.md."""
import json
import sys


def table(section):
    rows = section["rows"]
    out = [
        f"Data: `{section['data']}`, {section['elements']} values ({section['elements'] * 4 / 2**20:.0f} MiB fp32), "
        f"block {section['block']}; memcpy of the same bytes: {section['memcpy_gbps']:.1f} GB/s.",
        "",
        "| config | encode GB/s | decode GB/s | enc+dec GB/s | encode+EF GB/s | wire bytes | x smaller than fp32 | bits/value | rel. L2 error |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        zs = "" if r["zstd_level"] == 0 or r["zstd_applied"] else " (zstd skipped)"
        out.append(
            f"| {r['config']}{zs} | {r['encode_gbps']:.2f} | {r['decode_gbps']:.2f} | {r['encode_decode_gbps']:.2f} | "
            f"{r['encode_with_error_feedback_gbps']:.2f} | {r['wire_bytes']} | {r['ratio_vs_fp32']:.2f} | "
            f"{r['bits_per_value']:.2f} | {r['rel_l2_error']:.4f} |")
    return "\n".join(out)


def zstd_gain(section):
    by = {r["config"]: r for r in section["rows"]}
    levels = sorted({r["zstd_level"] for r in section["rows"] if r["zstd_level"] > 0})
    head = "| codec | ratio without zstd | " + " | ".join(f"zstd {l}: ratio (gain)" for l in levels) + \
        " | encode GB/s: none / " + " / ".join(f"zstd {l}" for l in levels) + " |"
    out = [head, "|---|---:|" + "---:|" * len(levels) + "---:|"]
    for name, r in by.items():
        if r["zstd_level"] != 0:
            continue
        zs = [by.get(f"{name}/zstd{l}") for l in levels]
        if not any(zs):
            continue
        cells = [f"{z['ratio_vs_fp32']:.2f} ({(z['ratio_vs_fp32'] / r['ratio_vs_fp32'] - 1) * 100:+.0f}%)" if z else "-"
                 for z in zs]
        speeds = [f"{z['encode_gbps']:.2f}" if z else "-" for z in zs]
        out.append(f"| {name} | {r['ratio_vs_fp32']:.2f} | " + " | ".join(cells) + " | "
                   f"{r['encode_gbps']:.2f} / " + " / ".join(speeds) + " |")
    return "\n".join(out)


def main():
    doc = json.load(open(sys.argv[1]) if len(sys.argv) > 1 else sys.stdin)
    for key in ("synthetic", "real"):
        if key in doc:
            print(table(doc[key]))
            print()
            print(zstd_gain(doc[key]))
            print()
    print("| target | set | geoloco | goal | met |")
    print("|---|---|---:|---:|---|")
    for t in doc["targets"]:
        print(f"| {t['target']} | {t['set']} | {t['geoloco']:.2f} | {t['goal']} | {'yes' if t['met'] else 'no'} |")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Turns bench_codecs JSON or quality.sh JSON (stdin or a file) into the markdown tables of
docs/compression.md."""
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


def quality(doc):
    """The training-quality table from bench/compression/quality.sh."""
    print("| run | final val loss | vs fp32 (same seed) | final train loss | x smaller than fp32 | wire bytes / outer step | WAN bytes sent |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, r in doc["runs"].items():
        print(f"| {name} | {r['val_loss']:.4f} | {r['rel_diff_vs_fp32'] * 100:+.2f}% | {r['final_loss']:.4f} | "
              f"{r['compression_ratio']:.2f} | {r['wire_bytes_per_outer_step']:.0f} | {r['wan_bytes_sent_total']} |")
    if "fp32_seed_spread" in doc:
        sp = doc["fp32_seed_spread"]
        print()
        print(f"fp32 across seeds: val loss {', '.join(f'{v:.4f}' for v in sp['val_losses'])}; "
              f"max-min {sp['max_minus_min_rel'] * 100:.2f}% of the mean.")
    print()
    print("| target | run | geoloco | fp32 | difference | goal | met |")
    print("|---|---|---:|---:|---:|---:|---|")
    for t in doc["targets"]:
        print(f"| {t['target']} | {t['run']} | {t['geoloco']:.4f} | {t['peer']:.4f} | {t['rel_diff'] * 100:+.2f}% | "
              f"{t['goal'] * 100:.0f}% | {'yes' if t['met'] else 'no'} |")


def main():
    doc = json.load(open(sys.argv[1]) if len(sys.argv) > 1 else sys.stdin)
    if doc.get("bench") == "compression quality":
        quality(doc)
        return
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

#!/usr/bin/env python3
"""Checks that every #include in geoloco's product code points down the layers.

Each folder may include its own files and those of the folders listed for it below (the
direction drawn in docs/ARCHITECTURE.md); a file belongs to the longest folder that prefixes
its path. tests/ and bench/ may include anything. Exit status: 0 when every include is
allowed, 1 (each offending include named as file:line: folder -> folder) otherwise, 2 for bad
arguments.

    tools/check_layers.py [--root DIR]    check the tree at DIR (default: the repository)
    tools/check_layers.py --print         the allowed edges, one folder per line
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

# Bottom to top. A folder may include the folders named for it (and their files only: the
# edges are not transitive, so each is stated where it is used).
ALLOWED: dict[str, list[str]] = {
    "core": [],
    "compression": ["core"],
    "transport": ["core"],
    "transport/ucx": ["core", "transport"],
    "transport/memory": ["core", "transport"],
    "transport/probe": ["core", "transport"],
    "trainer/model": ["core"],
    # The planning models: the WAN budget (a GPT-2 model section counts its parameters) and a
    # site's topology with the intra-site strategy model.
    "planner": ["core", "trainer/model"],
    "trainer/data": ["core"],
    "trainer/checkpoint": ["core", "compression", "trainer/model"],
    "trainer/optim": ["core", "trainer/model"],
    "trainer/parallel": ["core"],
    "trainer/cuda": ["core", "compression", "trainer/model", "trainer/optim", "trainer/parallel"],
    "trainer/launch": ["core"],
    # The outer loop: a library of its own, driven through the seam it owns (site.hpp).
    "outer_optimizer": ["core", "compression", "transport", "transport/probe", "planner"],
    # The inner loop (the native trainer) implements the outer loop's seam and drives it.
    "trainer/loop": [
        "core", "compression", "transport", "planner", "trainer/model", "trainer/data",
        "trainer/checkpoint", "trainer/optim", "trainer/parallel", "trainer/cuda", "outer_optimizer",
    ],
    "tools/plot": ["core"],
    "tools/wan": ["core", "transport/probe"],
    "tools/planner": ["core", "planner", "trainer/model", "trainer/loop", "tools/plot"],
    "tools/probe": ["core", "compression", "transport", "transport/ucx", "transport/probe", "planner", "trainer/loop"],
    "tools/report": ["core", "tools/plot"],
    # The CLI on top: everything.
    "trainer/app": [
        "core", "compression", "transport", "transport/ucx", "transport/memory", "transport/probe", "planner",
        "trainer/model", "trainer/data", "trainer/checkpoint", "trainer/optim", "trainer/parallel", "trainer/cuda",
        "trainer/launch", "outer_optimizer", "trainer/loop", "tools/plot", "tools/wan", "tools/planner",
        "tools/probe", "tools/report",
    ],
    # The Python package beside the CLI: the outer loop under another program's inner loop, read
    # from the same YAML, with the CLI's transport set-up and run summary.
    "python": ["core", "transport", "outer_optimizer", "trainer/loop", "trainer/app"],
}
FREE = ("tests/", "bench/")  # may include anything
SOURCES = (".cpp", ".hpp", ".cu", ".cuh", ".h", ".c")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def folder_of(path: str) -> str | None:
    """The longest folder of ALLOWED that prefixes `path`, or None."""
    best = None
    for f in ALLOWED:
        if path.startswith(f + "/") and (best is None or len(f) > len(best)):
            best = f
    return best


def check(root: Path) -> list[str]:
    """Every include against the direction, as 'file:line: what'."""
    problems: list[str] = []
    for src in sorted(root.rglob("*")):
        if not src.is_file() or src.suffix not in SOURCES:
            continue
        rel = src.relative_to(root).as_posix()
        if rel.startswith(FREE) or rel.startswith("build") or "/build/" in rel:
            continue
        mine = folder_of(rel)
        if mine is None:
            problems.append(f"{rel}:1: in no folder of the layer table (tools/check_layers.py)")
            continue
        for n, line in enumerate(src.read_text(errors="replace").splitlines(), 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            target = m.group(1)
            theirs = folder_of(target)
            if theirs is None or theirs == mine or theirs in ALLOWED[mine]:
                continue  # a relative or system-style include, its own folder, or allowed
            problems.append(f"{rel}:{n}: {mine} may not include {theirs} ({target})")
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    ap.add_argument("--print", action="store_true", help="print the allowed edges and exit")
    try:
        args = ap.parse_args()
    except SystemExit:
        return 2
    if args.print:
        for f, deps in ALLOWED.items():
            print(f"{f}: {', '.join(deps) if deps else '(nothing)'}")
        return 0
    if not args.root.is_dir():
        print(f"check_layers: {args.root}: not a directory", file=sys.stderr)
        return 2
    problems = check(args.root)
    for p in problems:
        print(p)
    if problems:
        print(f"check_layers: {len(problems)} include(s) against the layers (docs/ARCHITECTURE.md)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

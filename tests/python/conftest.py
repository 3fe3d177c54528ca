"""Shared fixtures of the Python package's tests (run by ctest: tests/python/CMakeLists.txt)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("GEOLOCO_BIN", REPO / "build" / "geoloco"))
PSK = REPO / "configs" / "demo.psk"


def free_port_block(n: int) -> int:
    """A base port with n free ports after it (bound and released; the tests pick far apart)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n >= 65000:
            continue
        ok = True
        for p in range(base, base + n):
            with socket.socket() as t:
                try:
                    t.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError("no free block of ports")


@pytest.fixture
def ports() -> "callable":
    return free_port_block


@pytest.fixture
def psk() -> Path:
    return PSK


@pytest.fixture
def geoloco_bin() -> Path:
    if not BIN.exists():
        raise RuntimeError(f"{BIN} is missing: build it first (tools/setup.sh)")
    return BIN

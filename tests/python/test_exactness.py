"""The package's outer math is the native loop's: the same parameters, the same local updates and the
same YAML give the same global weights, bit for bit, whether the outer loop is driven by the Python
package over UCX between processes or by the native test double of the seam over the in-memory
fabric (outer_twin)."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def f32_bits(values: list[float]) -> list[int]:
    return [struct.unpack("<I", struct.pack("<f", v))[0] for v in values]


@pytest.mark.parametrize(
    "outer",
    [
        "{interval: 5, optimizer: {kind: nesterov, lr: 0.7, momentum: 0.9}}",
        "{interval: 5, fragments: 2, overlap_steps: 1, compression: {codec: int8, error_feedback: true, zstd_level: 1}}",
    ],
    ids=["nesterov-fp32", "int8-ef-two-fragments-overlapped"],
)
def test_the_package_and_the_native_outer_loop_end_on_the_same_bits(
    tmp_path: Path, geoloco_bin: Path, ports, psk: Path, outer: str
) -> None:
    run_both(tmp_path, geoloco_bin, ports, psk, outer, ranks=1, env={})


def test_parameters_flattened_into_one_buffer_are_synced_in_place_on_the_same_bits(
    tmp_path: Path, geoloco_bin: Path, ports, psk: Path
) -> None:
    run_both(tmp_path, geoloco_bin, ports, psk,
             "{interval: 5, fragments: 2, overlap_steps: 1, compression: {codec: int8, error_feedback: true}}",
             ranks=1, env={"GEOLOCO_TEST_FLAT": "1"})


def test_a_sharded_inner_loop_ends_on_the_bits_of_the_native_outer_loop(
    tmp_path: Path, geoloco_bin: Path, ports, psk: Path
) -> None:
    # Two ranks per site, each holding only its shard of the flat parameters (elementwise outer
    # math: the same bits as one rank holding them all).
    run_both(tmp_path, geoloco_bin, ports, psk, "{interval: 5, optimizer: {kind: nesterov, lr: 0.7, momentum: 0.9}}",
             ranks=2, env={"GEOLOCO_TEST_SHARDED": "1"})


def run_both(tmp_path: Path, geoloco_bin: Path, ports, psk: Path, outer: str, ranks: int, env: dict) -> None:
    base = ports(30)
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        f"run: {{name: twin, output_dir: {tmp_path / 'out'}, command: [{sys.executable}, {HERE / 'twin_rank.py'}]}}\n"
        "train: {steps: 20, log_every: 5}\n"
        f"sites:\n  - {{name: paris, ranks: {ranks}, port: {base}}}\n"
        f"  - {{name: lyon, ranks: {ranks}, port: {base + 10}}}\n"
        f"outer: {outer}\n"
        f"transport: {{psk_file: {psk}}}\n"
    )
    twin = Path(os.environ.get("GEOLOCO_OUTER_TWIN", geoloco_bin.parent / "tests" / "python" / "outer_twin"))
    native = subprocess.run([str(twin), str(cfg)], capture_output=True, text=True, timeout=300)
    assert native.returncode == 0, native.stderr
    want = json.loads(native.stdout.strip().splitlines()[-1])  # (its log lines come first)
    run_env = dict(os.environ, GEOLOCO_TEST_OUT=str(tmp_path), **env)
    run_env.pop("PYTHONPATH", None)
    r = subprocess.run([str(geoloco_bin), "launch", str(cfg), "--plain"], cwd=tmp_path, env=run_env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    hashes = set()
    for site in ("paris", "lyon"):
        got = json.loads((tmp_path / f"{site}.json").read_text())
        hashes.add(got["hash"])
        # (The hash combines the exchange's pieces, which follow the sites' rank counts: compared
        # only where the native twin's sites, of one rank, are shaped the same.)
        if ranks == 1:
            assert got["hash"] == want["hash"], site
        assert f32_bits(got["params"]) == f32_bits(want["params"]), site
        # In place when the held tensors lie end to end: flattened, or a sharded loop's one shard.
        assert got["in_place"] == bool(env), site
    assert len(hashes) == 1


def test_sites_whose_parameters_differ_name_the_first_difference(
    tmp_path: Path, geoloco_bin: Path, ports, psk: Path
) -> None:
    base = ports(30)
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        f"run: {{name: twin, output_dir: {tmp_path / 'out'}, command: [{sys.executable}, {HERE / 'twin_rank.py'}]}}\n"
        "train: {steps: 10}\n"
        f"sites:\n  - {{name: paris, ranks: 1, port: {base}}}\n  - {{name: lyon, ranks: 1, port: {base + 10}}}\n"
        "outer: {interval: 5}\n"
        f"transport: {{psk_file: {psk}}}\n"
    )
    env = dict(os.environ, GEOLOCO_TEST_OUT=str(tmp_path), GEOLOCO_TEST_EXTRA_PARAM_SITE="lyon")
    env.pop("PYTHONPATH", None)
    r = subprocess.run([str(geoloco_bin), "launch", str(cfg), "--plain"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert ("the parameters differ between site paris and site lyon (rank 0): parameter 10 is absent here and "
            "'extra' of shape (4) there (10 vs 11 parameters)") in out, out[-3000:]

"""PyTorch ranks through real processes: `geoloco launch` starts run.command per rank with the
site's torch.distributed rendezvous; the sites sync through geoloco's outer loop over UCX and end
on one global-weights hash; a site killed mid-run is restarted by the launcher and rejoins."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def write_config(tmp_path: Path, sites: list[str], port_base: int, psk: Path, outer: str, steps: int) -> Path:
    lines = "\n".join(
        f"  - {{name: {s}, ranks: 2, host: 127.0.0.1, port: {port_base + 10 * i}}}" for i, s in enumerate(sites)
    )
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        f"run: {{name: t, output_dir: {tmp_path / 'out'}, command: [{sys.executable}, {HERE / 'torch_rank.py'}]}}\n"
        f"train: {{steps: {steps}, log_every: 5}}\n"
        f"sites:\n{lines}\n"
        f"outer: {outer}\n"
        f"transport: {{psk_file: {psk}, timeout_s: 20, connect_timeout_s: 30}}\n"
    )
    return cfg


def launch(geoloco_bin: Path, cfg: Path, tmp_path: Path, extra_env: dict[str, str] | None = None,
           args: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["GEOLOCO_TEST_OUT"] = str(tmp_path)
    env.pop("PYTHONPATH", None)  # the launcher sets it to the build's package
    env.update(extra_env or {})
    return subprocess.run(
        [str(geoloco_bin), "launch", str(cfg), "--plain", *(args or [])],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )


def results(tmp_path: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(tmp_path.glob("*.json"))]


def test_two_sites_of_two_ddp_ranks_end_on_one_hash(tmp_path: Path, geoloco_bin: Path, ports, psk: Path) -> None:
    cfg = write_config(tmp_path, ["paris", "lyon"], ports(40), psk,
                       "{interval: 10, compression: {codec: int8, error_feedback: true}}", 30)
    r = launch(geoloco_bin, cfg, tmp_path)
    assert r.returncode == 0, r.stderr[-4000:] + r.stdout[-2000:]
    got = results(tmp_path)
    assert [(g["site"], g["rank"]) for g in got] == [("lyon", 0), ("lyon", 1), ("paris", 0), ("paris", 1)]
    assert len({g["hash"] for g in got}) == 1, got
    assert all(g["outer_steps"] == 3 for g in got)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["global_weights_hash"] == got[0]["hash"]
    assert summary["inner_loop"] == "run.command" and len(summary["ranks"]) == 4
    # The records a native run writes: the site's metrics with the user's loss, the rounds.
    lines = [json.loads(x) for x in (tmp_path / "out" / "sites" / "lyon" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [5, 10, 15, 20, 25, 30]
    assert all(x["loss"] > 0 for x in lines)
    rounds = (tmp_path / "out" / "sites" / "paris" / "rounds.r1.jsonl").read_text().splitlines()
    assert len(rounds) == 3
    assert "geoloco: run 't' finished" in r.stdout


def test_a_killed_site_is_restarted_rejoins_and_the_run_ends_on_one_hash(
    tmp_path: Path, geoloco_bin: Path, ports, psk: Path
) -> None:
    cfg = write_config(
        tmp_path, ["paris", "lyon", "tokyo"], ports(60), psk,
        "{interval: 10, fragments: 2, overlap_steps: 1, compression: {codec: int4, error_feedback: true}}", 100,
    )
    r = launch(geoloco_bin, cfg, tmp_path, {"GEOLOCO_TEST_KILL": "lyon:1:24", "GEOLOCO_TEST_STEP_S": "0.15"},
               ["--restart-backoff-s", "0.5"])
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    # The situation happened: lyon/1 killed itself mid-run, lyon was restarted and joined.
    assert "[lyon/1] killing myself after step 24" in out
    assert "killed by signal 9" in out
    assert "joined at step" in out
    got = results(tmp_path)
    assert len(got) == 6, got
    assert len({g["hash"] for g in got}) == 1, got
    assert [g["joined"] for g in got if g["site"] == "lyon"] == [True, True]
    assert not any(g["joined"] for g in got if g["site"] != "lyon")


def test_worker_under_srun_runs_the_command_with_the_launch_environment(
    tmp_path: Path, geoloco_bin: Path, ports, psk: Path
) -> None:
    base = ports(30)
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        "run: {name: t, command: [/usr/bin/env]}\n"
        f"sites:\n  - {{name: paris, ranks: 2, port: {base}}}\n  - {{name: lyon, ranks: 2, port: {base + 10}}}\n"
        f"transport: {{psk_file: {psk}}}\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "GEOLOCO_"))}
    # Under srun: task 3 of 4 is lyon's rank 1 (sites in order, ranks contiguous).
    env.update(SLURM_PROCID="3", SLURM_NTASKS="4")
    r = subprocess.run([str(geoloco_bin), "worker", str(cfg), "--set", "train.steps=9"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    got = dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)
    assert got["GEOLOCO_SITE"] == "lyon" and got["GEOLOCO_RANK"] == "1" and got["GEOLOCO_GLOBAL_RANK"] == "3"
    assert got["RANK"] == "1" and got["WORLD_SIZE"] == "2" and got["LOCAL_RANK"] == "1"
    assert got["MASTER_ADDR"] == "127.0.0.1" and got["MASTER_PORT"] == str(base + 10 + 2)
    assert got["GEOLOCO_CONFIG"] == str(cfg) and got["GEOLOCO_SETS"] == "train.steps=9"
    assert got["GEOLOCO_JOIN"] == "0"
    assert got["PYTHONPATH"].split(":")[0] == str(geoloco_bin.parent / "python")


def test_a_command_that_cannot_run_is_named(tmp_path: Path, geoloco_bin: Path, psk: Path) -> None:
    cfg = tmp_path / "run.yaml"
    cfg.write_text("run: {name: t, command: [/nonexistent/python9, x.py]}\nsites: [{name: solo, ranks: 1}]\n")
    r = subprocess.run([str(geoloco_bin), "worker", str(cfg), "--site", "solo", "--rank", "0"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "run.command: cannot run /nonexistent/python9: No such file or directory" in r.stderr


@pytest.mark.parametrize("zero", ["0", "1"], ids=["adamw", "zero-redundancy-adamw"])
def test_a_stopped_run_resumes_from_its_checkpoint_and_ends_as_if_never_stopped(
    tmp_path: Path, geoloco_bin: Path, ports, psk: Path, zero: str
) -> None:
    outer = "{interval: 10, compression: {codec: int8, error_feedback: true}}"
    full_dir, cut_dir = tmp_path / "full", tmp_path / "cut"
    full_dir.mkdir()
    cut_dir.mkdir()
    full = write_config(full_dir, ["paris", "lyon"], ports(40), psk, outer, 40)
    r = launch(geoloco_bin, full, full_dir, {"GEOLOCO_TEST_ZERO": zero})
    assert r.returncode == 0, r.stderr[-4000:]
    want = {g["hash"] for g in results(full_dir)}
    assert len(want) == 1
    cut = write_config(cut_dir, ["paris", "lyon"], ports(40), psk, outer, 40)
    cut.write_text(cut.read_text().replace("log_every: 5", "log_every: 5, checkpoint_every: 20"))
    # Every rank stops after step 25: checkpoint 20 is the newest every site holds.
    r = launch(geoloco_bin, cut, cut_dir, {"GEOLOCO_TEST_EXIT_AT": "25", "GEOLOCO_TEST_ZERO": zero})
    assert r.returncode != 0
    assert "stopping after step 25" in r.stdout
    for site in ("paris", "lyon"):
        assert (cut_dir / "out" / "checkpoints" / site / "latest").read_text() == "step_00000020\n"
        assert (cut_dir / "out" / "checkpoints" / site / "step_00000020" / "state.r1.safetensors").exists()
    assert not list(cut_dir.glob("*.json"))
    r = launch(geoloco_bin, cut, cut_dir, {"GEOLOCO_TEST_ZERO": zero}, args=["--resume"])
    assert r.returncode == 0, r.stderr[-4000:]
    assert "resumed from" in r.stdout + r.stderr
    got = results(cut_dir)
    assert len(got) == 4 and all(g["resumed"] and g["start_step"] == 20 for g in got), got
    assert {g["hash"] for g in got} == want


def test_the_example_trains_on_two_campuses_and_geoloco_report_draws_it(
    tmp_path: Path, geoloco_bin: Path, ports
) -> None:
    base = ports(30)
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run(
        [str(geoloco_bin), "launch", "examples/torch/two-campus.yaml", "--plain", "--set", f"run.output_dir={out}",
         "--set", "train.steps=50", "--set", f"sites.0.port={base}", "--set", f"sites.1.port={base + 10}"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )
    assert r.returncode == 0, r.stderr[-4000:]
    lines = [x for x in r.stdout.splitlines() if "global weights" in x and "after 50 steps" in x]
    assert len(lines) == 2 and lines[0].split()[-4] == lines[1].split()[-4], lines
    summary = json.loads((out / "summary.json").read_text())
    assert summary["outer_steps"] == 2
    losses = [json.loads(x)["loss"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 2 and losses[1] < losses[0], losses  # it learns
    rep = subprocess.run([str(geoloco_bin), "report", str(out)], capture_output=True, text=True, timeout=300)
    assert rep.returncode == 0, rep.stderr
    assert (out / "report.html").stat().st_size > 1000


def test_ranks_of_a_site_whose_parameters_differ_name_the_first_difference(tmp_path: Path, geoloco_bin: Path,
                                                                          ports) -> None:
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        f"run: {{name: t, output_dir: {tmp_path / 'out'}, command: [{sys.executable}, {HERE / 'torch_rank.py'}]}}\n"
        f"train: {{steps: 10}}\nsites: [{{name: solo, ranks: 2, port: {ports(10)}}}]\nouter: {{interval: 5}}\n"
    )
    r = launch(geoloco_bin, cfg, tmp_path, {"GEOLOCO_TEST_EXTRA_PARAM": "solo:1"})
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert ("LayoutError: site solo: parameter 0 is ('extra', [3], 'torch.float32') on rank 1 but "
            "('emb.weight', [32, 16], 'torch.float32') on rank 0 (10 vs 9 parameters)") in out, out

"""The package in one process: a one-site run's outer loop over torch tensors, and every bad input
named (a tensor's dtype, device or layout, a config error with its file:line:col, calls out of order)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

import geoloco


def one_site_config(tmp_path: Path, extra: str = "", steps: int = 6, interval: int = 2) -> str:
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        "run: {name: t, output_dir: " + str(tmp_path / "out") + ", command: [python3, x.py]}\n"
        f"train: {{steps: {steps}, log_every: 2}}\n"
        "sites: [{name: solo, ranks: 1}]\n"
        f"outer: {{interval: {interval}, optimizer: {{kind: nesterov, lr: 0.7, momentum: 0.9}}{extra}}}\n"
    )
    return str(cfg)


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(16, 8)
        self.h = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(2))


def test_a_one_site_run_applies_the_outer_step_every_interval(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    outer = geoloco.OuterLoop(model, one_site_config(tmp_path), site="solo", rank=0, optimizer=opt, tokens_per_step=32)
    start = [p.detach().clone() for p in model.parameters()]
    rounds = []
    for _ in range(outer.total_steps):
        before = [p.detach().clone() for p in model.parameters()]
        for p in model.parameters():
            p.data.add_(0.01)  # the "inner step": every parameter moves by +0.01
        done = outer.step(loss=1.5)
        rounds.append(done)
        if done:
            # Nesterov on one site: the outer step moves the weights away from the inner result.
            moved = [p.detach() for p in model.parameters()]
            assert any(not torch.equal(a + 0.01, b) for a, b in zip(before, moved))
    assert rounds == [False, True, False, True, False, True]
    summary = outer.finish()
    assert summary["outer_steps"] == 3
    assert summary["params"] == sum(p.numel() for p in model.parameters())
    assert len(outer.global_weights_hash) == 16
    assert not all(torch.equal(a, b) for a, b in zip(start, model.parameters()))
    lines = (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 3 and '"loss":1.5' in lines[0].replace(" ", "")


def test_bfloat16_parameters_are_staged_and_written_back(tmp_path: Path) -> None:
    torch.manual_seed(0)
    p = torch.randn(4, 8).to(torch.bfloat16)
    outer = geoloco.OuterLoop([("h.0.w", p)], one_site_config(tmp_path, steps=2), site="solo", rank=0)
    before = p.clone()
    p.add_(1.0)
    outer.step()
    assert outer.step()  # the round at step 2 rewrote p through its float32 stage
    assert p.dtype == torch.bfloat16
    assert not torch.equal(p, before + 1.0)
    outer.finish()


@pytest.mark.parametrize(
    "tensor, words",
    [
        (torch.zeros(4, 4, dtype=torch.int64), "dtype torch.int64"),
        (torch.zeros(4, 4, dtype=torch.float64), "dtype torch.float64"),
        (torch.zeros(4, 6).t(), "not contiguous"),
        (torch.zeros(0), "no elements"),
        (torch.zeros(4, 4).to_sparse(), "layout torch.sparse_coo"),
    ],
)
def test_a_tensor_it_cannot_take_is_named(tmp_path: Path, tensor: torch.Tensor, words: str) -> None:
    good = torch.zeros(8)
    with pytest.raises(geoloco.TensorError) as e:
        geoloco.OuterLoop([("h.0.good", good), ("h.1.bad", tensor)], one_site_config(tmp_path), site="solo", rank=0)
    assert "parameter 'h.1.bad'" in str(e.value) and words in str(e.value)
    assert isinstance(e.value, TypeError) and isinstance(e.value, geoloco.InputError)


def test_a_config_error_names_the_file_line_and_column(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("run: {name: t, command: [python3, x.py]}\nsites: [{name: solo, ranks: 1}]\nouter: {intervl: 2}\n")
    with pytest.raises(geoloco.ConfigError) as e:
        geoloco.OuterLoop([("w", torch.zeros(4))], str(cfg), site="solo", rank=0)
    assert f"{cfg}:3:" in str(e.value) and "intervl" in str(e.value)


def test_the_model_sections_are_refused_under_run_command(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(
        "run: {name: t, command: [python3, x.py]}\nmodel: {n_layer: 2}\nsites: [{name: solo, ranks: 1}]\nouter: {}\n"
    )
    with pytest.raises(geoloco.ConfigError, match=r"bad.yaml:2:.*model.*the program's own"):
        geoloco.OuterLoop([("w", torch.zeros(4))], str(cfg), site="solo", rank=0)


def test_an_unknown_site_and_a_rank_out_of_range_are_named(tmp_path: Path) -> None:
    cfg = one_site_config(tmp_path)
    with pytest.raises(geoloco.ConfigError, match="no site 'lyon' \\(sites: solo\\)"):
        geoloco.OuterLoop([("w", torch.zeros(4))], cfg, site="lyon", rank=0)
    with pytest.raises(geoloco.InputError, match="rank 1 of a site of 1 ranks"):
        geoloco.OuterLoop([("w", torch.zeros(4))], cfg, site="solo", rank=1)


def test_more_fragments_than_blocks_is_refused(tmp_path: Path) -> None:
    cfg = one_site_config(tmp_path, extra=", fragments: 3", interval=6)
    with pytest.raises(geoloco.ConfigError, match="outer.fragments is 3, but the parameters name 2 block"):
        geoloco.OuterLoop(Tiny(), cfg, site="solo", rank=0)


def test_calls_out_of_order_are_refused(tmp_path: Path) -> None:
    outer = geoloco.OuterLoop([("w", torch.zeros(4))], one_site_config(tmp_path, steps=2), site="solo", rank=0)
    with pytest.raises(geoloco.InputError, match="finish\\(\\) at step 0: the run ends at step 2"):
        outer.finish()
    outer.step()
    outer.step()
    outer.finish()
    with pytest.raises(geoloco.InputError, match="step\\(\\) after finish\\(\\)"):
        outer.step()
    with pytest.raises(geoloco.InputError, match="finish\\(\\) called twice"):
        outer.finish()


def test_without_the_launcher_the_missing_place_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GEOLOCO_CONFIG", raising=False)
    with pytest.raises(geoloco.InputError, match="GEOLOCO_CONFIG is not set"):
        geoloco.OuterLoop([("w", torch.zeros(4))])


def test_the_loss_may_be_a_tensor_and_nan_is_not_an_error(tmp_path: Path) -> None:
    outer = geoloco.OuterLoop([("w", torch.zeros(4))], one_site_config(tmp_path, steps=2), site="solo", rank=0)
    outer.step(torch.tensor(2.0))
    outer.step(math.nan)
    assert outer.finish()["final_loss"] == 2.0


def test_resume_refuses_a_checkpoint_of_other_parameters_or_a_corrupt_one(tmp_path: Path) -> None:
    cfg = one_site_config(tmp_path, steps=6)
    Path(cfg).write_text(Path(cfg).read_text().replace("log_every: 2", "log_every: 2, checkpoint_every: 2"))
    opt_params = [("h.0.w", torch.zeros(4, 4))]
    opt = torch.optim.SGD([p for _, p in opt_params], lr=0.1)
    outer = geoloco.OuterLoop(opt_params, cfg, site="solo", rank=0, optimizer=opt)
    for _ in range(5):
        opt_params[0][1].add_(0.5)
        outer.step()
    outer.close()
    state = tmp_path / "out" / "checkpoints" / "solo" / "step_00000004" / "state.r0.safetensors"
    assert state.exists() and (tmp_path / "out" / "checkpoints" / "solo" / "latest").read_text() == "step_00000004\n"
    # The same parameters resume at step 4 with the saved values.
    again = [("h.0.w", torch.zeros(4, 4))]
    opt2 = torch.optim.SGD([p for _, p in again], lr=0.1)
    resumed = geoloco.OuterLoop(again, cfg, site="solo", rank=0, optimizer=opt2, resume=True)
    assert resumed.resumed and resumed.start_step == 4
    assert not torch.equal(again[0][1], torch.zeros(4, 4))
    resumed.close()
    with pytest.raises(geoloco.InputError, match="holds other parameters"):
        geoloco.OuterLoop([("h.0.w", torch.zeros(4, 5))], cfg, site="solo", rank=0, resume=True)
    data = bytearray(state.read_bytes())
    data[-3] ^= 0xFF
    state.write_bytes(bytes(data))
    with pytest.raises(geoloco.InputError, match=str(state)):
        geoloco.OuterLoop([("h.0.w", torch.zeros(4, 4))], cfg, site="solo", rank=0, resume=True)


def test_flatten_parameters_makes_views_of_one_buffer_with_the_same_values() -> None:
    torch.manual_seed(0)
    model = Tiny()
    before = [p.detach().clone() for p in model.parameters()]
    flat = geoloco.flatten_parameters(model)
    params = list(model.parameters())
    assert flat.numel() == sum(p.numel() for p in params)
    assert all(torch.equal(a, b) for a, b in zip(before, params))
    assert params[1].data_ptr() == params[0].data_ptr() + 4 * params[0].numel()
    flat.zero_()
    assert all(float(p.abs().sum()) == 0.0 for p in params)
    with pytest.raises(geoloco.TensorError, match="CPU float32 only"):
        geoloco.flatten_parameters(torch.nn.Linear(2, 2).to(torch.float64))

"""WindowSampler: disjoint windows over every rank of every site, resumable at any step."""

from __future__ import annotations

import itertools

import pytest
import torch

import geoloco


def take(s: geoloco.WindowSampler, n: int) -> list[int]:
    return list(itertools.islice(iter(s), n))


def test_every_rank_of_every_site_trains_disjoint_windows() -> None:
    world, n = 6, 1000
    per = [take(geoloco.WindowSampler(n, batch_size=4, seed=3, global_rank=g, world_size=world), n // world)
           for g in range(world)]
    flat = [i for p in per for i in p]
    assert len(flat) == len(set(flat)) == (n // world) * world
    assert all(0 <= i < n for i in flat)


def test_a_rank_resumed_at_step_k_gets_the_windows_it_would_have_had() -> None:
    full = take(geoloco.WindowSampler(500, batch_size=8, seed=1, global_rank=2, world_size=4), 300)
    for k in (0, 3, 15, 16, 30):  # 125 windows per epoch: 15 and 16 steps straddle the epoch's end
        resumed = take(geoloco.WindowSampler(500, batch_size=8, seed=1, global_rank=2, world_size=4, start_step=k), 40)
        assert resumed == full[k * 8 : k * 8 + 40], k


def test_epochs_differ_and_the_seed_matters() -> None:
    s = geoloco.WindowSampler(100, batch_size=1, seed=5, global_rank=0, world_size=2)
    a = take(s, 100)
    assert a[:50] != a[50:]  # each epoch deals a new permutation
    assert take(geoloco.WindowSampler(100, batch_size=1, seed=6, global_rank=0, world_size=2), 50) != a[:50]


def test_it_feeds_a_dataloader() -> None:
    data = torch.arange(64)
    s = geoloco.WindowSampler(64, batch_size=4, seed=0, global_rank=1, world_size=4)
    batch = next(iter(torch.utils.data.DataLoader(data, batch_size=4, sampler=s)))
    assert batch.tolist() == take(s, 4)


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(global_rank=4, world_size=4), "global rank 4 of 4 ranks"),
        (dict(global_rank=0, world_size=4, batch_size=0), "batch_size 0"),
        (dict(global_rank=0, world_size=400), "3 windows for 400 ranks"),
    ],
)
def test_bad_arguments_are_named(kwargs: dict, words: str) -> None:
    kwargs.setdefault("batch_size", 1)
    n = 3 if kwargs.get("world_size") == 400 else 100
    with pytest.raises(geoloco.InputError, match=words):
        geoloco.WindowSampler(n, **kwargs)

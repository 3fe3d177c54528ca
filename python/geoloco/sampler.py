"""WindowSampler: geoloco's data contract for torch's DataLoader.

Every rank of every site trains disjoint windows: each epoch is one seeded permutation of the
dataset's indices, shared by all ranks, dealt round-robin over the run's global ranks (rank g takes
positions g, g + W, g + 2W, ... with W the run's rank count). The order depends only on the seed,
the epoch and the rank's global index, so a resumed or rejoined rank that starts at step k gets the
windows it would have had at step k (``start_step``).
"""

from __future__ import annotations

import os
from typing import Iterator, Optional

import torch
from torch.utils.data import Sampler

from geoloco._native import InputError


class WindowSampler(Sampler[int]):
    """Indices of this rank's windows, disjoint across every rank of every site.

    Args:
        num_windows: the dataset's length.
        batch_size: windows per inner step on this rank (to skip ``start_step`` steps' worth).
        seed: the run's data seed (the same on every rank).
        global_rank, world_size: this rank among every rank of every site; default: from
            ``geoloco launch`` (``GEOLOCO_GLOBAL_RANK``, ``GEOLOCO_WORLD_SIZE``).
        start_step: the inner steps already trained (``OuterLoop.start_step`` after a join or resume).
    """

    def __init__(
        self,
        num_windows: int,
        *,
        batch_size: int,
        seed: int = 0,
        global_rank: Optional[int] = None,
        world_size: Optional[int] = None,
        start_step: int = 0,
    ) -> None:
        if global_rank is None:
            global_rank = int(os.environ.get("GEOLOCO_GLOBAL_RANK", "0"))
        if world_size is None:
            world_size = int(os.environ.get("GEOLOCO_WORLD_SIZE", "1"))
        if world_size < 1 or not 0 <= global_rank < world_size:
            raise InputError(f"WindowSampler: global rank {global_rank} of {world_size} ranks")
        if batch_size < 1 or start_step < 0:
            raise InputError(f"WindowSampler: batch_size {batch_size}, start_step {start_step}")
        if num_windows < world_size:
            raise InputError(
                f"WindowSampler: {num_windows} windows for {world_size} ranks: every rank needs at least one"
            )
        self.num_windows = num_windows
        self.batch_size = batch_size
        self.seed = seed
        self.global_rank = global_rank
        self.world_size = world_size
        self.start_step = start_step

    def per_epoch(self) -> int:
        """Windows this rank takes from each epoch (every rank the same count; the remainder is left)."""
        return self.num_windows // self.world_size

    def __len__(self) -> int:
        return self.per_epoch() - (self.start_step * self.batch_size) % self.per_epoch()

    def __iter__(self) -> Iterator[int]:
        """From the window after ``start_step`` steps on, through every later epoch (an endless stream)."""
        taken = self.start_step * self.batch_size
        epoch, skip = divmod(taken, self.per_epoch())
        while True:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            order = torch.randperm(self.num_windows, generator=g)
            mine = order[self.global_rank :: self.world_size][: self.per_epoch()]
            for i in mine[skip:].tolist():
                yield int(i)
            epoch, skip = epoch + 1, 0

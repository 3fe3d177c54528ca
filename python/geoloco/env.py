"""What ``geoloco launch`` tells the program it starts for each rank (trainer/app/worker_commands.cpp).

The launcher sets, besides torchrun's ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``
and ``MASTER_PORT`` (the site's own torch.distributed rendezvous):

- ``GEOLOCO_CONFIG``: the run's YAML; ``GEOLOCO_SETS``: its ``--set`` overrides, one per line;
- ``GEOLOCO_SITE``, ``GEOLOCO_RANK``: this rank's site and rank in it;
- ``GEOLOCO_JOIN``: ``1`` when a lost site was restarted and joins the running job;
- ``GEOLOCO_RESUME``: ``1`` under ``--resume``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Mapping, Optional

from geoloco._native import InputError


@dataclass(frozen=True)
class LaunchEnv:
    """One rank's place in the run, as the launcher gave it."""

    config: str
    site: str
    rank: int
    sets: list[str] = field(default_factory=list)
    join: bool = False
    resume: bool = False

    @staticmethod
    def from_environ(environ: Optional[Mapping[str, str]] = None) -> "LaunchEnv":
        """Reads the variables above; raises :class:`geoloco.InputError` naming a missing or bad one."""
        env = os.environ if environ is None else environ

        def need(key: str) -> str:
            value = env.get(key, "")
            if not value:
                raise InputError(
                    f"{key} is not set: start this program with `geoloco launch <config>` (run.command), "
                    "or pass config=, site= and rank= to OuterLoop"
                )
            return value

        config = need("GEOLOCO_CONFIG")
        site = need("GEOLOCO_SITE")
        rank_text = need("GEOLOCO_RANK")
        if not rank_text.isdigit():
            raise InputError(f"GEOLOCO_RANK={rank_text!r}: expected a rank number")
        sets = [line for line in env.get("GEOLOCO_SETS", "").split("\n") if line]
        return LaunchEnv(
            config=config,
            site=site,
            rank=int(rank_text),
            sets=sets,
            join=env.get("GEOLOCO_JOIN", "0") == "1",
            resume=env.get("GEOLOCO_RESUME", "0") == "1",
        )

    @staticmethod
    def launched(environ: Optional[Mapping[str, str]] = None) -> bool:
        """Whether this process was started by ``geoloco launch``."""
        env = os.environ if environ is None else environ
        return bool(env.get("GEOLOCO_CONFIG"))

"""geoloco for PyTorch users: geoloco's outer loop between campuses, under your own training loop.

Your model, inner optimizer, LR schedule, DistributedDataParallel and data loader stay yours;
every H steps :class:`OuterLoop` exchanges compressed pseudo-gradients with the other sites
(everything the YAML's ``outer:`` offers) and writes the new global weights into your
parameters. See docs/pytorch.md.

Import it with Debian's Python and the build's package on the path::

    PYTHONPATH=build/python /usr/bin/python3 train.py

(``geoloco launch`` sets that path for the programs it starts.)
"""

from geoloco._native import (  # noqa: F401  (re-exported)
    ConfigError,
    Error,
    InputError,
    JoinError,
    QuorumLost,
    SiteLeftOut,
    TransportError,
)
from geoloco.env import LaunchEnv  # noqa: F401
from geoloco.outer_loop import LayoutError, OuterLoop, TensorError, flatten_parameters, shard_range  # noqa: F401
from geoloco.sampler import WindowSampler  # noqa: F401

__all__ = [
    "ConfigError",
    "Error",
    "InputError",
    "JoinError",
    "LaunchEnv",
    "LayoutError",
    "OuterLoop",
    "QuorumLost",
    "SiteLeftOut",
    "TensorError",
    "TransportError",
    "WindowSampler",
    "flatten_parameters",
    "shard_range",
]

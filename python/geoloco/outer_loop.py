"""OuterLoop: geoloco's outer loop (DiLoCo between sites) driven from a PyTorch training loop.

A few lines in the user's loop::

    outer = geoloco.OuterLoop(model.named_parameters(), optimizer=opt)  # config, site, rank from geoloco launch
    for step in range(outer.start_step + 1, outer.total_steps + 1):
        loss = train_one_step(...)          # the user's forward, backward, optimizer.step()
        outer.step(loss)                    # every H steps: a round with the other sites
    summary = outer.finish()                # the last sync: every rank of every site on one hash

Tensors are taken through what every torch version has (``data_ptr``, ``numel``, ``dtype``,
``device``, ``is_contiguous``). CPU float32 tensors are read and written in place; bfloat16 and
float16 tensors, and tensors on a GPU, are staged through host float32 buffers (pinned for a GPU)
around each read and write of the outer loop.
"""

from __future__ import annotations

import atexit
import io
import json
import math
import weakref
from typing import Any, Iterable, Optional, Sequence, Union

import torch
import torch.distributed as dist

from geoloco import _native
from geoloco._native import InputError
from geoloco.env import LaunchEnv

Named = Iterable[tuple[str, torch.Tensor]]


class TensorError(InputError, TypeError):
    """A parameter the outer loop cannot take: its dtype, device or layout (named in the message)."""


class LayoutError(InputError):
    """The parameters differ between the ranks of a site (count, name, shape or order)."""


_STAGED_DTYPES = (torch.bfloat16, torch.float16)


class _Param:
    """One parameter as the native side sees it: the tensor itself or its host float32 stage."""

    def __init__(self, name: str, tensor: torch.Tensor) -> None:
        if not isinstance(tensor, torch.Tensor):
            raise TensorError(f"parameter '{name}': expected a torch.Tensor, got {type(tensor).__name__}")
        if tensor.layout != torch.strided:
            raise TensorError(f"parameter '{name}': layout {tensor.layout}; the outer loop takes dense tensors")
        if not tensor.is_contiguous():
            raise TensorError(
                f"parameter '{name}': not contiguous (strides {tuple(tensor.stride())} for shape "
                f"{tuple(tensor.shape)}); the outer loop reads parameters as one block of memory"
            )
        if tensor.dtype != torch.float32 and tensor.dtype not in _STAGED_DTYPES:
            raise TensorError(
                f"parameter '{name}': dtype {tensor.dtype}; the outer loop takes float32, bfloat16 or float16"
            )
        if tensor.numel() == 0:
            raise TensorError(f"parameter '{name}': no elements")
        self.name = name
        self.tensor = tensor
        self.staged = tensor.dtype != torch.float32 or tensor.device.type != "cpu"
        if self.staged:
            pin = tensor.device.type == "cuda"
            self.host = torch.empty(tensor.shape, dtype=torch.float32, pin_memory=pin)
        else:
            self.host = tensor

    def describe(self) -> tuple[str, int, int, list[int]]:
        return (self.name, int(self.host.data_ptr()), int(self.host.numel()), [int(d) for d in self.host.shape])

    def stage_in(self) -> None:
        with torch.no_grad():
            self.host.copy_(self.tensor)

    def stage_out(self) -> None:
        with torch.no_grad():
            self.tensor.copy_(self.host)


def _named(params: Union[torch.nn.Module, Named, Sequence[torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
    if isinstance(params, torch.nn.Module):
        return list(params.named_parameters())
    out: list[tuple[str, torch.Tensor]] = []
    for i, item in enumerate(params):
        if isinstance(item, torch.Tensor):
            out.append((f"param{i}", item))
        elif isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str):
            out.append((item[0], item[1]))
        else:
            raise TensorError(f"parameter {i}: expected a tensor or a (name, tensor) pair, got {type(item).__name__}")
    return out


class OuterLoop:
    """geoloco's outer loop for one rank of one site, over the user's parameters.

    Args:
        params: the model (its ``named_parameters()``), ``(name, tensor)`` pairs, or tensors. Every
            rank of every site passes the same names, shapes and order. A tensor's block (what a
            streaming fragment takes whole) is the first number in its name (``h.3.attn.weight``).
        config: the run's YAML (the same file ``geoloco launch`` reads). Default: ``GEOLOCO_CONFIG``.
        site, rank: this rank's site (by name) and rank in it. Default: from ``geoloco launch``.
        optimizer: the inner optimizer; its state is reset when the outer loop resets it
            (``outer.inner_state: reset``) and when a restarted site joins, and it is saved in every
            checkpoint (``train.checkpoint_every``) and restored by ``--resume``.
        scheduler: the LR scheduler, saved and restored with the optimizer.
        process_group: the site's torch.distributed group (default: the default group). Needed when
            the site has more than one rank: the outer loop's votes and the all-gather of the merged
            parameters run over it.
        tokens_per_step: the site's tokens per inner step, over all its ranks (the weight of its
            contribution under ``outer.weighting: tokens``, and the records' counts).
        sets: ``--set`` overrides (``"outer.interval=50"``). Default: the launcher's.
        join: this site joins a running job (a restart). Default: the launcher's ``GEOLOCO_JOIN``.
        resume: restore the newest checkpoint every site holds (``geoloco launch --resume``); the
            loop then starts after ``start_step``. Default: the launcher's ``GEOLOCO_RESUME``.
        total_steps: the run's last inner step; default ``train.steps`` of the config.
        layout: a sharded inner loop (each rank holds only a shard of the flat parameters, as FSDP's
            flat parameters): the model's ``(name, shape)`` in order, and ``params`` this rank's
            shard of their concatenated values -- ``geoloco.shard_range(total, rank, ranks)`` says
            which -- as one or more tensors. A merge writes the shard; nothing is gathered.
    """

    def __init__(
        self,
        params: Union[torch.nn.Module, Named, Sequence[torch.Tensor]],
        config: Optional[str] = None,
        *,
        site: Optional[str] = None,
        rank: Optional[int] = None,
        optimizer: Optional[torch.optim.Optimizer] = None,
        scheduler: Optional[Any] = None,
        process_group: Optional[Any] = None,
        tokens_per_step: int = 0,
        sets: Optional[list[str]] = None,
        join: Optional[bool] = None,
        resume: Optional[bool] = None,
        total_steps: Optional[int] = None,
        layout: Optional[Sequence[tuple[str, Sequence[int]]]] = None,
    ) -> None:
        launch = LaunchEnv.from_environ() if (config is None or site is None or rank is None) else None
        self.config = config if config is not None else launch.config  # type: ignore[union-attr]
        self.site = site if site is not None else launch.site  # type: ignore[union-attr]
        self.rank = int(rank if rank is not None else launch.rank)  # type: ignore[union-attr]
        if sets is None:
            sets = launch.sets if launch is not None else []
        if join is None:
            join = launch.join if launch is not None else False
        if resume is None:
            resume = launch.resume if launch is not None else False
        if join and resume:
            raise InputError("join and resume exclude each other: a restarted site joins, a stopped run resumes")
        self.optimizer = optimizer
        self.scheduler = scheduler
        self._group = process_group
        self._params = [_Param(n, t) for n, t in _named(params)]
        if not self._params:
            raise TensorError("no parameters were given")
        self._staged = [p for p in self._params if p.staged]
        self._site_ranks = self._group_size()
        self._layout = None if layout is None else [(str(n), [int(d) for d in shape]) for n, shape in layout]
        if self._layout is not None and not self._layout:
            raise TensorError("layout: empty; a sharded loop gives the model's (name, shape) in order")
        if self._site_ranks > 1:
            self._check_site_layout()
        self._session = _native.Session(
            config=self.config,
            sets=list(sets),
            site=self.site,
            rank=self.rank,
            join=bool(join),
            resume=bool(resume),
            tokens_per_step=int(tokens_per_step),
            total_steps=int(total_steps or 0),
            tensors=[p.describe() for p in self._params],
            layout=[(n, 0, math.prod(shape), shape) for n, shape in (self._layout or [])],
            all_gather=self._all_gather if self._site_ranks > 1 else None,
            sum=self._sum if self._site_ranks > 1 else None,
            stage_in=self._stage_in if self._staged else None,
            stage_out=self._stage_out if self._staged else None,
            reset_inner_state=self._reset_inner_state,
        )
        # Close the transport before the interpreter tears the process down (its thread reports
        # to a logger that exit destroys); finish() closes it first in a run that ends well.
        atexit.register(_close_at_exit, weakref.ref(self._session))
        self._step = 0
        self.joined = bool(join)
        self.resumed = False
        if join:
            self._step = int(self._session.join())
            self._reset_inner_state()
        elif resume:
            got = self._session.resume()
            if got is not None:
                self._step = int(got[0])
                self._load_inner_state(got[1])
                self.resumed = True
        self._start_step = self._step
        self._finished = False

    # ---- the user's calls ----

    @property
    def start_step(self) -> int:
        """The inner step the loop starts after: 0, the step a joining site's state was committed at,
        or the step of the checkpoint ``--resume`` restored."""
        return self._start_step

    @property
    def inner_step(self) -> int:
        """The last inner step reported with :meth:`step`."""
        return self._step

    @property
    def total_steps(self) -> int:
        """The run's last inner step (``train.steps``)."""
        return int(self._session.total_steps)

    @property
    def global_weights_hash(self) -> str:
        """The hash of the global weights the sites last agreed on (hex)."""
        return str(self._session.global_weights_hash)

    @property
    def in_place(self) -> bool:
        """Whether the outer loop reads and writes the parameters in place (they lie end to end in one
        buffer, as :func:`flatten_parameters` leaves them) rather than through copies."""
        return bool(self._session.in_place)

    @property
    def output_dir(self) -> str:
        """Where the run's records go (``run.output_dir``)."""
        return str(self._session.output_dir)

    def trains_step(self) -> bool:
        """Whether the next inner step trains (False: ``outer.pace: time`` skips it on a faster site)."""
        return bool(self._session.trains_step(self._step + 1))

    def step(self, loss: Union[None, float, torch.Tensor] = None) -> bool:
        """Call once after each inner step (after ``optimizer.step()``), on every rank of the site.

        ``loss`` (this rank's, a float or a scalar tensor) goes into the records as the site's mean.
        Returns True when an outer round completed (the parameters then hold new global weights).
        """
        if self._finished:
            raise InputError(f"step() after finish() (site {self.site}, rank {self.rank})")
        if isinstance(loss, torch.Tensor):
            loss = float(loss.detach().float().mean().item())
        value = math.nan if loss is None else float(loss)
        self._step += 1
        done = bool(self._session.after_step(self._step, value))
        every = int(self._session.checkpoint_every)
        if every > 0 and self._step % every == 0 and self._step < self.total_steps:
            self._session.save_checkpoint(self._step, self._inner_state())
        return done

    def finish(self) -> dict[str, Any]:
        """After the last inner step: the final sync, the records closed, the run's summary.

        Returns this rank's summary (the run's, with every rank's, where summary.json was written).
        """
        if self._finished:
            raise InputError(f"finish() called twice (site {self.site}, rank {self.rank})")
        if self._step != self.total_steps:
            raise InputError(
                f"finish() at step {self._step}: the run ends at step {self.total_steps} (train.steps), where every "
                "site syncs; call step() once per inner step until then"
            )
        summary = json.loads(self._session.finish(self._step))  # also closes the transport
        self._finished = True
        return summary

    def close(self) -> None:
        """Leaves the run without finishing it (the other sites see this rank go); idempotent."""
        self._session.close()

    def __enter__(self) -> "OuterLoop":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def metrics(self) -> dict[str, Any]:
        """The outer loop's current figures (rounds, bytes, waits), as in metrics.jsonl."""
        return json.loads(self._session.metrics())

    # ---- the site's exchange, over the user's process group ----

    def _group_size(self) -> int:
        if not dist.is_available() or not dist.is_initialized():
            return 1
        return int(dist.get_world_size(self._group))

    def _device(self) -> torch.device:
        if dist.get_backend(self._group) == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def _all_gather(self, data: bytes) -> list[bytes]:
        dev = self._device()
        n = torch.tensor([len(data)], dtype=torch.int64, device=dev)
        sizes = [torch.zeros(1, dtype=torch.int64, device=dev) for _ in range(self._site_ranks)]
        dist.all_gather(sizes, n, group=self._group)
        longest = max(int(s.item()) for s in sizes)
        mine = torch.zeros(max(longest, 1), dtype=torch.uint8)
        if data:
            mine[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        mine = mine.to(dev)
        parts = [torch.zeros(max(longest, 1), dtype=torch.uint8, device=dev) for _ in range(self._site_ranks)]
        dist.all_gather(parts, mine, group=self._group)
        return [bytes(p[: int(s.item())].cpu().numpy().tobytes()) for p, s in zip(parts, sizes)]

    def _sum(self, values: list[float]) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64, device=self._device())
        dist.all_reduce(t, group=self._group)
        return [float(v) for v in t.cpu().tolist()]

    def _check_site_layout(self) -> None:
        if self._layout is not None:  # a sharded loop: the model's layout is what every rank shares
            mine: list[Any] = [(n, shape, "layout") for n, shape in self._layout]
        else:
            mine = [(p.name, list(p.tensor.shape), str(p.tensor.dtype)) for p in self._params]
        everyone: list[Any] = [None] * self._site_ranks
        dist.all_gather_object(everyone, mine, group=self._group)
        for r, theirs in enumerate(everyone):
            if theirs == mine:
                continue
            for i in range(max(len(mine), len(theirs))):
                a = mine[i] if i < len(mine) else None
                b = theirs[i] if i < len(theirs) else None
                if a != b:
                    raise LayoutError(
                        f"site {self.site}: parameter {i} is {a} on rank {self.rank} but {b} on rank {r} "
                        f"({len(mine)} vs {len(theirs)} parameters): every rank passes the same names, shapes and order"
                    )

    # ---- staging and the inner optimizer ----

    def _stage_in(self) -> None:
        for p in self._staged:
            p.stage_in()

    def _stage_out(self) -> None:
        for p in self._staged:
            p.stage_out()

    def _local_optimizer(self) -> Optional[torch.optim.Optimizer]:
        """The optimizer whose state this rank holds: ZeroRedundancyOptimizer's local shard's."""
        opt = self.optimizer
        if opt is not None and type(opt).__name__ == "ZeroRedundancyOptimizer" and hasattr(opt, "optim"):
            return opt.optim  # each rank saves and restores its own shard's state
        return opt

    def _reset_inner_state(self) -> None:
        opt = self._local_optimizer()
        if opt is not None:
            opt.state.clear()

    def _inner_state(self) -> bytes:
        """The inner optimizer's and scheduler's state_dict, as torch.save writes them (this rank's)."""
        state: dict[str, Any] = {}
        opt = self._local_optimizer()
        if opt is not None:
            state["optimizer"] = opt.state_dict()
        if self.scheduler is not None:
            state["scheduler"] = self.scheduler.state_dict()
        buf = io.BytesIO()
        torch.save(state, buf)
        return buf.getvalue()

    def _load_inner_state(self, data: bytes) -> None:
        state = torch.load(io.BytesIO(data)) if data else {}
        local = self._local_optimizer()
        for key, obj in (("optimizer", local), ("scheduler", self.scheduler)):
            if obj is None:
                continue
            if key not in state:
                raise InputError(f"the checkpoint holds no {key} state, but OuterLoop was given a {key} to restore")
            obj.load_state_dict(state[key])
        if local is not None and local is not self.optimizer:
            # ZeroRedundancyOptimizer copies its own groups' hyperparameters (the scheduler's lr) into
            # the local optimizer at every step: they come back from the local groups saved.
            for mine, saved in zip(self.optimizer.param_groups, local.param_groups):
                for k, v in saved.items():
                    if k != "params":
                        mine[k] = v


def _close_at_exit(ref: "weakref.ref[Any]") -> None:
    session = ref()
    if session is not None:
        session.close()


def flatten_parameters(module: torch.nn.Module) -> torch.Tensor:
    """Moves a module's parameters into one flat float32 buffer, each parameter a view of it, and
    returns the buffer. The outer loop then reads and writes them in place, with no copy (as geoloco's
    own trainer). Call it before building the optimizer and DDP; CPU float32 parameters only."""
    params = list(module.parameters())
    for i, p in enumerate(params):
        if p.dtype != torch.float32 or p.device.type != "cpu":
            raise TensorError(f"flatten_parameters: parameter {i} is {p.dtype} on {p.device}; CPU float32 only")
    flat = torch.empty(sum(p.numel() for p in params), dtype=torch.float32)
    at = 0
    with torch.no_grad():
        for p in params:
            n = p.numel()
            flat[at : at + n].copy_(p.reshape(-1))
            p.data = flat[at : at + n].view_as(p)
            at += n
    return flat


def shard_range(total: int, rank: int, ranks: int) -> tuple[int, int]:
    """``(offset, count)``: rank ``rank``'s shard of ``total`` flat values over ``ranks`` ranks (geoloco's rule:
    contiguous, the first ``total % ranks`` ranks one value more)."""
    offset, count = _native.shard_range(total, rank, ranks)
    return int(offset), int(count)

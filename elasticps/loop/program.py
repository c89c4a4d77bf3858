"""A user's own training loop as a job: what a describe run learned of it.

:class:`LoopProgram` stands where a :class:`~elasticps.program.TrainingProgram`
stands for the runtime (the controller, the PS shards, the manager's describe
step), but the training is the user's function, run in every worker. Its plain
data comes from one *describe run* of that function (:mod:`elasticps.loop.describe`):
the model and optimizer given to ``prepare``, the ``DataLoader``'s dataset
length, global batch and order, and the ``epochs(n)`` count.

:class:`OptimizerLayout` says how the user's optimizer maps onto the flat
parameter vector: each param group is a set of contiguous segments, and a PS
shard builds one tensor per segment it holds, in a group with that group's
hyperparameters, so per-group learning rates and weight decay shard exactly.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from elasticps.errors import ProgramError
from elasticps.loop.rows import Tables
from elasticps.program import ELEMENTWISE_OPTIMIZERS, check_batch_range, lr_factor


@dataclass(frozen=True)
class OptimizerLayout:
    """The user's optimizer: its class, defaults, each param group's
    hyperparameters, and ``segments``: ``(lo, hi, group)`` runs of the flat vector."""

    cls: type[torch.optim.Optimizer]
    defaults: dict[str, Any]
    groups: list[dict[str, Any]]
    segments: list[tuple[int, int, int]]

    @property
    def name(self) -> str:
        return f"{self.cls.__module__}.{self.cls.__qualname__}"

    @staticmethod
    def of(model: torch.nn.Module, opt: torch.optim.Optimizer, inexact: bool) -> OptimizerLayout:
        """The layout of ``opt`` over ``model``'s trainable parameters, or a
        ProgramError that says what to change."""
        if type(opt) not in ELEMENTWISE_OPTIMIZERS.values() and not inexact:
            raise ProgramError(
                f"optimizer {type(opt).__qualname__} is not one of "
                f"{sorted(c.__name__ for c in ELEMENTWISE_OPTIMIZERS.values())}, whose updates shard exactly; "
                "pass inexact_optimizer=True to elasticps.torch.prepare to run it per PS shard"
            )
        group_of: dict[int, int] = {}
        for g, group in enumerate(opt.param_groups):
            for p in group["params"]:
                group_of[id(p)] = g
        trainable = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        names = {id(p) for _, p in trainable}
        if any(pid not in names for pid in group_of):
            raise ProgramError(
                "the optimizer holds parameters that are not trainable parameters of the prepared model "
                "(a second model?): prepare one model with the one optimizer over its parameters"
            )
        missing = [name for name, p in trainable if id(p) not in group_of]
        if missing:
            raise ProgramError(
                f"trainable parameters {missing[:3]} are not in the optimizer: give them to it, "
                "or set requires_grad=False on those the loop does not train"
            )
        segments: list[tuple[int, int, int]] = []
        offset = 0
        for _, p in trainable:
            g, n = group_of[id(p)], p.numel()
            if segments and segments[-1][2] == g and segments[-1][1] == offset:
                segments[-1] = (segments[-1][0], offset + n, g)
            else:
                segments.append((offset, offset + n, g))
            offset += n
        groups = [{k: v for k, v in group.items() if k != "params"} for group in opt.param_groups]
        return OptimizerLayout(type(opt), dict(opt.defaults), groups, segments)

    def build(self, data: torch.Tensor, lo: int) -> tuple[torch.optim.Optimizer, list[torch.nn.Parameter]]:
        """The optimizer of a PS shard holding ``data`` = elements ``lo..`` of the
        flat vector: one parameter (a view of ``data``) per segment it overlaps."""
        hi = lo + data.numel()
        params: list[torch.nn.Parameter] = []
        groups: list[dict[str, Any]] = []
        for a, b, g in self.segments:
            a, b = max(a, lo), min(b, hi)
            if a < b:
                params.append(torch.nn.Parameter(data[a - lo : b - lo]))
                groups.append({**self.groups[g], "params": [params[-1]], "user_group": g})
        if not params:  # an empty shard (before its state is set)
            params.append(torch.nn.Parameter(data))
            groups.append({**self.groups[0], "params": [params[-1]], "user_group": 0})
        accepted = inspect.signature(self.cls.__init__).parameters
        defaults = {k: v for k, v in self.defaults.items() if k in accepted}  # groups carry the rest
        try:
            return self.cls(groups, **defaults), params
        except TypeError as exc:
            raise ProgramError(f"cannot rebuild {self.name} from its defaults on a PS shard: {exc}") from exc


@dataclass
class LoopProgram:
    """A user's training function, described: plain data for the runtime."""

    name: str
    fn: Callable[..., Any]
    args: dict[str, Any]
    epochs: int
    batch_size: int
    num_samples: int
    shuffle: bool
    seed: int
    layout: OptimizerLayout
    registered: tuple[str, ...] = ()
    tables: Tables | None = None  # embedding tables the PS holds and the workers do not
    rng_states: tuple[bytes, ...] = ()  # torch's generator at the describe run's rng points (api.rng_point)
    model: torch.nn.Module | None = field(default=None, repr=False)  # the controller's copy only
    max_batch_size: int | None = None  # the DataLoader's: the global batch may grow up to it
    lr_scaling: str = "sqrt"  # the DataLoader's: how the user's lr follows the global batch
    metric: None = None
    eval_dataset: None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "model": None}  # tasks do not need the describe run's model

    @property
    def optimizer_name(self) -> str:
        return self.layout.name

    def check_batch(self, batch: int) -> int:
        """``batch`` if the loop may train at it (its DataLoader's ``batch_size``
        up to its ``max_batch_size``), else a ProgramError."""
        if self.max_batch_size is None and batch != self.batch_size:
            raise ProgramError(
                f"{self.name}: the loop trains at its DataLoader's batch {self.batch_size}, got {batch!r}: "
                "give elasticps.torch.DataLoader a max_batch_size to let the global batch adapt"
            )
        return check_batch_range(self.name, self.batch_size, self.max_batch_size, batch)

    def lr_at(self, step: int, batch: int) -> float:
        """The factor on every lr of the user's optimizer at global batch ``batch``:
        (batch / batch_size) ** k by ``lr_scaling``. The lr itself is the user's
        (their scheduler's at ``step``), read from the workers each step; the
        PS shards apply it times this factor."""
        return lr_factor(batch, self.batch_size, self.lr_scaling)

    def lr_text(self, step: int, batch: int) -> str:
        """The rule at ``batch``, for the job's events."""
        return f"the optimizer's lr x{self.lr_at(step, batch):.4g}, {self.lr_scaling} scaling"

    def build_model(self) -> torch.nn.Module:
        if self.model is None:
            raise ProgramError(f"{self.name}: the model of a user loop is only known where it was described")
        return self.model

    def initial_params(self) -> np.ndarray:
        from elasticps.runtime.flat import flat_params

        return flat_params(self.build_model())

    def build_dataset(self) -> range:
        """A stand-in of the training set with its length (the workers read the data)."""
        return range(self.num_samples)

    def build_eval_dataset(self) -> None:
        return None

    def shard_optimizer(self, data: torch.Tensor, lo: int) -> tuple[torch.optim.Optimizer, list[torch.nn.Parameter]]:
        return self.layout.build(data, lo)

"""Two sessions that run the user's function outside a job's workers.

:class:`LocalSession`: plain single-process training (``python train.py``),
in the data order a job uses, so the same function gives the same parameters
run alone or as an elastic job (the yardstick of ``sync`` mode).

:class:`DescribeSession`: runs the function up to its first batch and records
what the runtime needs (:func:`describe_call`), then stops it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import torch

from elasticps.errors import ProgramError
from elasticps.loop.api import DataLoader, active
from elasticps.loop.embedding import tables_of
from elasticps.loop.program import LoopProgram, OptimizerLayout
from elasticps.loop.rows import Tables
from elasticps.runtime.data import DataPosition, GlobalBatches

log = logging.getLogger("elasticps.torch")


def check_prepare_args(model: Any, opt: Any) -> None:
    if not isinstance(model, torch.nn.Module):
        raise ProgramError(f"prepare(model, optimizer): model is a {type(model).__name__}, not a torch.nn.Module")
    if not isinstance(opt, torch.optim.Optimizer):
        raise ProgramError(f"prepare(model, optimizer): optimizer is a {type(opt).__name__}, not a torch Optimizer")


class LocalSession:
    """Single-process training: the calls do what they say, nothing more."""

    def __init__(self) -> None:
        self.epoch: int | None = None
        self.batches = 0
        self.reports: list[dict[str, Any]] = []

    def prepare(self, model: Any, opt: Any, inexact: bool) -> tuple[Any, Any]:
        check_prepare_args(model, opt)
        tables_of(model)  # what a job would refuse, refused here too
        return model, opt

    def add_loader(self, loader: DataLoader) -> None:
        loader.local_epochs = 0  # type: ignore[attr-defined]

    def iterate(self, loader: DataLoader) -> Iterator[Any]:
        epoch = self.epoch if self.epoch is not None else loader.local_epochs  # type: ignore[attr-defined]
        loader.local_epochs += 1  # type: ignore[attr-defined]
        order = GlobalBatches(loader.seed, len(loader.dataset), loader.batch_size, loader.shuffle)
        pos = DataPosition(epoch, 0)
        while pos.epoch == epoch:
            idx, pos = order.take(pos, loader.batch_size)
            yield loader.fetch(idx)
            self.batches += 1

    def epochs(self, n: int) -> Iterator[int]:
        for e in range(n):
            self.epoch = e
            yield e
        self.epoch = None

    def report(self, metrics: dict[str, float]) -> dict[str, Any]:
        record = {"step": self.batches, "epoch": self.epoch, "metrics": metrics}
        self.reports.append(record)
        log.info("step %d: %s", self.batches, metrics)
        return record

    def register(self, objects: dict[str, Any]) -> None:
        pass

    def step(self) -> int:
        return self.batches

    def rng_point(self) -> None:
        pass


class Described(BaseException):
    """Stops a describe run at its first batch (not an Exception: the user's
    ``except Exception`` does not catch it)."""


class DescribeSession:
    """Records the model, optimizer, loader and epoch count of a describe run."""

    def __init__(self) -> None:
        self.model: torch.nn.Module | None = None
        self.layout: OptimizerLayout | None = None
        self.loader: DataLoader | None = None
        self.num_epochs: int | None = None
        self.registered: tuple[str, ...] = ()
        self.tables: Tables | None = None
        self.rng_states: list[bytes] = []
        self.used = False

    def prepare(self, model: Any, opt: Any, inexact: bool) -> tuple[Any, Any]:
        self.used = True
        check_prepare_args(model, opt)
        if self.model is not None:
            raise ProgramError("prepare() was called twice: a job trains one model with one optimizer")
        self.layout = OptimizerLayout.of(model, opt, inexact)
        self.tables = tables_of(model)[0]
        self.model = model
        if self.tables is not None:
            self.rng_point()
        return model, opt

    def add_loader(self, loader: DataLoader) -> None:
        self.used = True
        if self.loader is not None:
            raise ProgramError(
                "a second elasticps.torch.DataLoader: it is the training set; evaluate with torch.utils.data.DataLoader"
            )
        self.loader = loader

    def iterate(self, loader: DataLoader) -> Iterator[Any]:
        raise Described()

    def epochs(self, n: int) -> Iterator[int]:
        self.used = True
        self.num_epochs = n
        raise Described()

    def report(self, metrics: dict[str, float]) -> dict[str, Any]:
        return {"step": 0, "epoch": None, "metrics": metrics}

    def register(self, objects: dict[str, Any]) -> None:
        self.used = True
        self.registered += tuple(objects)

    def step(self) -> int:
        return 0

    def rng_point(self) -> None:
        self.rng_states.append(torch.get_rng_state().numpy().tobytes())

    def program(self, name: str, fn: Callable[..., Any], args: dict[str, Any]) -> LoopProgram:
        missing = [
            what
            for what, value in (
                ("elasticps.torch.prepare(model, optimizer)", self.model),
                ("an elasticps.torch.DataLoader", self.loader),
                ("for epoch in elasticps.torch.epochs(n)", self.num_epochs),
            )
            if value is None
        ]
        if missing:
            raise ProgramError(f"{name}: a loop needs {', '.join(missing)} before its first batch")
        assert self.loader is not None and self.layout is not None and self.num_epochs is not None
        return LoopProgram(
            name=name,
            fn=fn,
            args=dict(args),
            epochs=self.num_epochs,
            batch_size=self.loader.batch_size,
            num_samples=len(self.loader.dataset),
            shuffle=self.loader.shuffle,
            seed=self.loader.seed,
            layout=self.layout,
            registered=self.registered,
            tables=self.tables,
            rng_states=tuple(self.rng_states),
            model=self.model,
            max_batch_size=self.loader.max_batch_size,
            lr_scaling=self.loader.lr_scaling,
        )


def describe_call(name: str, fn: Callable[..., Any], args: dict[str, Any]) -> Any:
    """Call ``fn(**args)`` under a describe session: a :class:`LoopProgram` if
    it is a training loop (it reached its first batch), else what it returned
    (a factory's TrainingProgram)."""
    session = DescribeSession()
    with active(session):
        try:
            result = fn(**args)
        except Described:
            return session.program(name, fn, args)
    if session.used:
        raise ProgramError(f"{name} used elasticps.torch but returned before its first batch")
    return result

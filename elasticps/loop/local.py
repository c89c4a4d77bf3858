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
from elasticps.loop.rules import (
    LossWatch,
    ParamsWatch,
    check_step,
    check_stepped,
    epoch_cut_short,
    norm_layers,
    prepared_twice,
    route_step,
)
from elasticps.runtime.data import DataPosition, GlobalBatches

log = logging.getLogger("elasticps.torch")


def check_prepare_args(model: Any, opt: Any) -> None:
    if not isinstance(model, torch.nn.Module):
        raise ProgramError(f"prepare(model, optimizer): model is a {type(model).__name__}, not a torch.nn.Module")
    if not isinstance(opt, torch.optim.Optimizer):
        raise ProgramError(f"prepare(model, optimizer): optimizer is a {type(opt).__name__}, not a torch Optimizer")


class LocalStep:
    """A prepared loop's step in one process: inside ``epochs(n)``, the rules a
    job's worker holds a step to (:mod:`elasticps.loop.rules`) are checked, then
    the optimizer's own ``step()`` runs. Checking reads the model and copies its
    parameters on the first steps; what the loop computes is unchanged."""

    def __init__(self, model: torch.nn.Module, opt: torch.optim.Optimizer, skip: set[int]) -> None:
        self.own_step = opt.step  # the optimizer's (or an LR scheduler's wrapper of it)
        # what a worker holds and checks: trainable parameters, a PS-held table's aside
        self.params = [p for p in model.parameters() if p.requires_grad and id(p) not in skip]
        self.norms = norm_layers(model)
        self.watch = ParamsWatch()
        self.losses = LossWatch()  # the loss is not a sum over the batch (first backward() calls)
        self.bound: list[torch.Tensor] | None = None  # the parameters as the prepared optimizer left them
        self.active = False  # inside epochs(n): the loop is what a job would run
        self.batch_open = False  # a batch was handed out and not stepped yet
        self.last_of: int | None = None  # the open batch is the last of this epoch
        self.stepped_epoch: int | None = None  # the last epoch whose last batch was stepped

    def optimizer_step(self, closure: Any) -> Any:
        if not self.active:  # outside epochs(n), which a job refuses when it describes the loop
            return self.own_step(closure) if closure is not None else self.own_step()
        check_step(closure, self.batch_open, self.norms)
        self.check_params("between the batch and the prepared optimizer's step()")
        out = self.own_step()
        self.batch_open = False
        if self.last_of is not None:
            self.stepped_epoch = self.last_of
        self._bind()
        return out

    def next_batch(self, epoch: int, last: bool) -> None:
        """The loop asks for a batch of ``epoch`` (``last``: its last one)."""
        check_stepped(not self.batch_open, self.check_params)
        if self.bound is None:
            self._bind()
        self.check_params("between the prepared optimizer's step() and the next batch")
        self.batch_open, self.last_of = True, epoch if last else None

    def end_epoch(self, epoch: int) -> None:
        if self.stepped_epoch != epoch:
            raise epoch_cut_short(epoch)

    def check_params(self, where: str = "", lead: str = "") -> None:
        self.watch.check(self._changed if self.bound is not None else None, where, lead)

    def _changed(self) -> bool:
        assert self.bound is not None
        return any(not torch.equal(p, b) for p, b in zip(self.params, self.bound, strict=True))

    def _bind(self) -> None:
        if self.watch.checks_left > 0:
            self.bound = [p.detach().clone() for p in self.params]


class LocalSession:
    """Single-process training: the calls do what they say, and a prepared
    loop's steps inside ``epochs(n)`` keep the rules a job's worker checks
    (:class:`LocalStep`)."""

    def __init__(self) -> None:
        self.epoch: int | None = None
        self.batches = 0
        self.reports: list[dict[str, Any]] = []
        self.prepared: LocalStep | None = None  # the latest prepare()'s, until its epochs(n) loop takes it
        self.rules: LocalStep | None = None  # that of the epochs(n) loop running

    def prepare(self, model: Any, opt: Any, inexact: bool) -> tuple[Any, Any]:
        check_prepare_args(model, opt)
        tables, modules = tables_of(model)  # what a job would refuse, refused here too
        if hasattr(opt, "_elasticps_session"):
            raise prepared_twice()
        self.prepared = LocalStep(model, opt, {id(m.weight) for m in modules} if tables else set())
        route_step(opt, self.prepared)
        return model, opt

    def add_loader(self, loader: DataLoader) -> None:
        loader.local_epochs = 0  # type: ignore[attr-defined]

    def iterate(self, loader: DataLoader) -> Iterator[Any]:
        epoch = self.epoch if self.epoch is not None else loader.local_epochs  # type: ignore[attr-defined]
        loader.local_epochs += 1  # type: ignore[attr-defined]
        order = GlobalBatches(loader.seed, len(loader.dataset), loader.batch_size, loader.shuffle)
        pos = DataPosition(epoch, 0)
        rules = self.rules if self.epoch is not None else None
        while pos.epoch == epoch:
            idx, pos = order.take(pos, loader.batch_size)
            if rules is not None:
                rules.next_batch(epoch, last=pos.epoch != epoch)
            yield loader.fetch(idx)
            self.batches += 1

    def epochs(self, n: int) -> Iterator[int]:
        rules, self.prepared = self.prepared, None  # a loop that did not prepare() is not checked
        self.rules = rules
        if rules is not None:
            rules.active = True
            rules.losses.start()
        try:
            for e in range(n):
                self.epoch = e
                yield e
                if rules is not None:
                    rules.end_epoch(e)
        finally:
            self.epoch = None
            if rules is not None:
                rules.active = False
                rules.losses.stop()
            if self.rules is rules:
                self.rules = None

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
            raise prepared_twice()
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

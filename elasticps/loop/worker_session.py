"""A user's loop inside a job's worker: where its calls meet the controller's.

The user's function runs in a thread of the worker actor
(:class:`~elasticps.runtime.loop_worker.LoopWorker`); the actor's methods,
called by the controller, put messages into :attr:`WorkerSession.inbox`:

- :class:`StepMessage` (a step's parameters and this worker's share of its
  global batch): the DataLoader yields that share; the prepared optimizer's
  ``step()`` hands the gradient to the actor (:attr:`outbox`) and waits for
  the next message, which brings the new parameters;
- :class:`ParamsMessage`: new parameters without a batch (where the next step
  is, or that training is over), optionally asking for a snapshot of the
  registered state at the loop's next wait for a batch, that is after the
  user's code that follows a step (an LR scheduler's ``step()``, an epoch's
  evaluation) and before the next batch;
- ``RELEASE``: the worker leaves the job; the loop ends quietly at its wait.

Parameters are copied into the model's own flat buffer (the user may read and
write them freely between steps); gradients are gathered into the flat
gradient buffer at ``step()`` and weighted by this worker's share of the
global batch, so the sum over workers is the global-batch mean gradient.
A model's PS-held tables (:class:`~elasticps.loop.embedding.Embedding`) are
in neither buffer: their rows are read and pushed by a
:class:`~elasticps.loop.embedding.RowClient`.
"""

from __future__ import annotations

import io
import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from elasticps.errors import ProgramError
from elasticps.loop import rules
from elasticps.loop.api import DataLoader
from elasticps.loop.embedding import RowClient, tables_of
from elasticps.loop.local import check_prepare_args
from elasticps.loop.program import LoopProgram, OptimizerLayout
from elasticps.runtime.config import DEFAULT_STEP_TIMEOUT_S
from elasticps.runtime.flat import FlatModel

UNKNOWN = object()  # where the next step is, before the first message
RELEASE = object()


@dataclass
class StepMessage:
    step: int
    epoch: int
    parts: list[np.ndarray]
    bounds: list[tuple[int, int]]
    indices: np.ndarray
    batch: Future | None  # the batch read in the background, if the loader was known
    scale: float  # this worker's share of the global batch (0: it pads a batch smaller than the workers)
    user_state: bytes | None = None


@dataclass
class ParamsMessage:
    step: int  # the step these parameters start
    parts: list[np.ndarray]
    bounds: list[tuple[int, int]]
    next_epoch: int | None  # None: training is over
    snapshot: bool = False


class Released(BaseException):
    """Ends a released worker's loop (not an Exception: ``except Exception`` lets it pass)."""


def _hyperparameters(opt: torch.optim.Optimizer) -> list[dict[str, Any]]:
    """Each param group's numeric hyperparameters now (lr, betas, weight_decay, ...)."""
    out = []
    for group in opt.param_groups:
        hyper: dict[str, Any] = {}
        for k, v in group.items():
            if isinstance(v, torch.Tensor) and v.numel() == 1:
                v = float(v)
            number = isinstance(v, (int, float)) and not isinstance(v, bool)
            if number or (isinstance(v, tuple) and all(isinstance(x, (int, float)) for x in v)):
                hyper[k] = v
        out.append(hyper)
    return out


@dataclass
class WorkerSession:
    tables_on_ps = True  # an elasticps.torch.Embedding built here allocates nothing

    program: LoopProgram
    grad_buffer: Callable[[int], np.ndarray | None]
    inbox: queue.Queue = field(default_factory=queue.Queue)
    outbox: queue.Queue = field(default_factory=queue.Queue)
    snapshots: queue.Queue = field(default_factory=queue.Queue)
    wait_s: float = DEFAULT_STEP_TIMEOUT_S  # how long a read of PS-held rows waits (RowClient)

    def __post_init__(self) -> None:
        self.flat: FlatModel | None = None
        self.opt: torch.optim.Optimizer | None = None
        self.loader: DataLoader | None = None
        self.current: StepMessage | None = None
        self.pushed = True
        self.stash: StepMessage | None = None
        self.next_epoch: Any = UNKNOWN
        self.epoch: int | None = None
        self.steps = 0
        self.reports: list[dict[str, Any]] = []
        self.registered: dict[str, Any] = {}
        self.snapshot_wanted = False
        self.loss_sum = 0.0
        self.prepared = threading.Event()  # set by prepare() (and by the actor if the function ends first)
        self.clip: tuple[float, float] | None = None  # this batch's clip_grad_norm_ (max_norm, norm_type)
        self.norm_layers: list[torch.nn.Module] = []
        self.bound: tuple[list[np.ndarray], list[tuple[int, int]]] | None = None
        self.watch = rules.ParamsWatch()  # only the prepared optimizer changes the parameters (first steps)
        # the loss is not a sum over the batch (first backward() calls); every loss noted for the reports
        self.losses = rules.LossWatch(note=self.note_loss)
        self.rows: RowClient | None = None
        self.rng_points = 0  # rng_point() calls so far
        self.row_grads: list[tuple[int, np.ndarray, np.ndarray]] = []  # the last step's, for the push

    # -- the user's calls -------------------------------------------------------------
    def prepare(self, model: Any, opt: Any, inexact: bool) -> tuple[Any, Any]:
        check_prepare_args(model, opt)
        if self.flat is not None:
            raise rules.prepared_twice()
        layout = OptimizerLayout.of(model, opt, inexact)
        if layout.segments != self.program.layout.segments:
            raise ProgramError("this worker's model or param groups differ from those of the describe run")
        numel = layout.segments[-1][1] if layout.segments else 0
        tables, modules = tables_of(model)
        if tables != self.program.tables:
            raise ProgramError("this worker's elasticps.torch.Embedding tables differ from those of the describe run")
        if tables is not None:
            self.rows = RowClient(tables, modules, self._first_params, self.wait_s)
            numel = tables.dense(numel)
            self.rng_point()
        skip = self.rows.param_ids if self.rows else None
        self.flat = FlatModel(model, self.grad_buffer(numel), skip)
        self.norm_layers = rules.norm_layers(model)
        self.opt = opt
        rules.route_step(opt, self)
        self.prepared.set()
        return model, opt

    def add_loader(self, loader: DataLoader) -> None:
        if self.loader is not None:
            raise ProgramError(
                "a second elasticps.torch.DataLoader: it is the training set; evaluate with torch.utils.data.DataLoader"
            )
        p = self.program
        fields = {
            "dataset length": (len(loader.dataset), p.num_samples),
            "batch_size": (loader.batch_size, p.batch_size),
            "max_batch_size": (loader.max_batch_size, p.max_batch_size),
            "lr_scaling": (loader.lr_scaling, p.lr_scaling),
        }
        differs = [
            f"{name} {here!r} here, {there!r} in the describe run"
            for name, (here, there) in fields.items()
            if here != there
        ]
        if differs:
            raise ProgramError(
                f"this worker's DataLoader differs from the describe run's: {'; '.join(differs)} "
                "(the function must build the same DataLoader in every process)"
            )
        self.loader = loader

    def epochs(self, n: int) -> Iterator[int]:
        if n != self.program.epochs:
            raise ProgramError(f"epochs({n}) here, epochs({self.program.epochs}) in the describe run")
        self.losses.start()
        try:
            while True:
                if self.next_epoch is UNKNOWN:
                    self._receive(self._wait(boundary=True))
                if self.next_epoch is None or self.next_epoch >= n:
                    self.epoch = None
                    return
                if self.next_epoch == self.epoch:
                    raise rules.epoch_cut_short(self.epoch)
                self.epoch = self.next_epoch
                yield self.epoch
        finally:
            self.losses.stop()

    def iterate(self, loader: DataLoader) -> Iterator[Any]:
        if self.epoch is None:
            raise ProgramError("iterate the DataLoader inside `for epoch in elasticps.torch.epochs(n)`")
        epoch = self.epoch
        while True:
            rules.check_stepped(self.pushed, self._check_params)
            msg = self.stash
            if msg is None:
                if self.next_epoch is not UNKNOWN and self.next_epoch != epoch:
                    return
                self._receive(self._wait(boundary=True))
                continue
            if msg.epoch != epoch:
                return
            self._check_params("between the prepared optimizer's step() and the next batch")
            if msg.user_state is not None:  # where the state was snapshotted: after the code that follows a step
                self.restore(msg.user_state)
            self.stash, self.current, self.pushed, self.loss_sum, self.clip = None, msg, False, 0.0, None
            if self.rows is not None:
                self.rows.start_batch()
            yield msg.batch.result() if msg.batch is not None else loader.fetch(msg.indices)

    def report(self, metrics: dict[str, float]) -> dict[str, Any]:
        record = {"step": self.steps, "epoch": self.epoch, "metrics": metrics}
        self.reports.append(record)
        return record

    def register(self, objects: dict[str, Any]) -> None:
        self.registered.update(objects)

    def step(self) -> int:
        return self.steps

    def rng_point(self) -> None:
        """torch's generator where the describe run's stood at this point of the
        function (after a ``tables_on_ps`` call; at ``prepare`` of a model with
        PS-held tables). A worker's table allocates nothing, so it draws no initial
        values (nor do the loop's own inits of it): what the loop draws after it
        (its data, a later layer's buffer) would differ from one process's."""
        states, i = self.program.rng_states, self.rng_points
        if i >= len(states):
            raise ProgramError("this worker's function builds its model otherwise than the describe run's did")
        torch.set_rng_state(torch.frombuffer(bytearray(states[i]), dtype=torch.uint8))
        self.rng_points += 1

    # -- the step boundary ------------------------------------------------------------
    def optimizer_step(self, closure: Callable[[], Any] | None) -> None:
        msg = self.current
        rules.check_step(closure, msg is not None and not self.pushed, self.norm_layers)
        assert msg is not None and self.flat is not None and self.opt is not None
        self._check_params("between the batch and the prepared optimizer's step()")
        self.flat.collect_grads()
        if msg.scale != 1.0:
            self.flat.grads.mul_(msg.scale)
        self.row_grads = self.rows.take_grads(msg.scale) if self.rows else []
        samples = len(msg.indices) if msg.scale > 0 else 0
        stats = {
            "groups": _hyperparameters(self.opt),
            "loss_sum": self.loss_sum * samples,
            "clip": self.clip,
            "reports": self.take_reports(),
        }
        self.pushed = True
        self.outbox.put(stats)
        self._receive(self._wait(boundary=False))
        self.current = None

    def clips(self, params: list[torch.Tensor], max_norm: float, norm_type: float) -> bool:
        """Whether a ``clip_grad_norm_`` over ``params`` is this loop's global-norm
        clipping (recorded; the PS shards clip the global gradient), or a
        ProgramError if it cannot be applied to the global gradient."""
        if self.flat is None or self.current is None:
            return False
        ours = {id(p) for p, _, _ in self.flat.layout} | (self.rows.param_ids if self.rows else set())
        given = {id(p) for p in params}
        if not given & ours:
            return False
        if given != ours:
            raise ProgramError(
                "clip_grad_norm_ over part of the prepared model's parameters: the PS shards clip the "
                "global gradient of all of them; clip over model.parameters()"
            )
        if norm_type not in (2.0, float("inf")):
            raise ProgramError(f"clip_grad_norm_ with norm_type={norm_type}: a job clips by the 2-norm or inf-norm")
        self.clip = (max_norm, norm_type)
        return True

    def _check_params(self, where: str = "", lead: str = "") -> None:
        """On a worker's first steps: the parameters are still those pulled (:class:`ParamsWatch`)."""
        self.watch.check(self._changed if self.bound is not None and self.flat is not None else None, where, lead)

    def _changed(self) -> bool:
        assert self.bound is not None and self.flat is not None
        parts, bounds = self.bound
        return any(
            not torch.equal(self.flat.params[lo:hi], torch.from_numpy(np.asarray(part)))
            for part, (lo, hi) in zip(parts, bounds, strict=True)
        )

    def note_loss(self, value: float) -> None:
        """A scalar the loop called ``backward()`` on (its loss), for the job's reports."""
        self.loss_sum += value

    def held_bytes(self) -> int:
        """The bytes this worker holds of the model: its flat parameter and
        gradient buffers, and every model tensor with storage of its own."""
        assert self.flat is not None
        storages = {}
        for t in [*self.flat.model.parameters(), *self.flat.model.buffers(), self.flat.params, self.flat.grads]:
            if t.device.type != "meta":
                storage = t.untyped_storage()
                storages[storage.data_ptr()] = storage.nbytes()
        return sum(storages.values())

    def take_reports(self) -> list[dict[str, Any]]:
        out, self.reports = self.reports, []
        return out

    # -- messages -----------------------------------------------------------------------
    def _wait(self, boundary: bool) -> Any:
        if boundary and self.snapshot_wanted:
            self.snapshot_wanted = False
            self.snapshots.put({"state": self.snapshot(), "reports": self.take_reports()})
        msg = self.inbox.get()
        if msg is RELEASE:
            raise Released()
        return msg

    def _first_params(self) -> None:
        """The job's parameters, if none came yet: the loop uses its model before
        its first batch (a PS-held table is read at the parameters the job has)."""
        if self.next_epoch is UNKNOWN:
            self._receive(self._wait(boundary=True))

    def _receive(self, msg: StepMessage | ParamsMessage) -> None:
        assert self.flat is not None, "a message before prepare()"
        parts, bounds = self.rows.bind(msg.parts, msg.bounds, msg.step) if self.rows else (msg.parts, msg.bounds)
        self.flat.load(parts, bounds)
        self.bound = (parts, bounds)
        self.steps = msg.step
        if isinstance(msg, StepMessage):
            self.stash, self.next_epoch = msg, msg.epoch
        else:
            self.next_epoch = msg.next_epoch
            self.snapshot_wanted = self.snapshot_wanted or msg.snapshot

    def snapshot(self) -> bytes | None:
        """The registered objects' state and the prepared optimizer's
        hyperparameters (an LR scheduler sets them, and restoring a scheduler
        does not), serialised; None before ``prepare``."""
        if self.opt is None:
            return None
        buf = io.BytesIO()
        states = {name: obj.state_dict() for name, obj in self.registered.items()}
        torch.save({"registered": states, "groups": _hyperparameters(self.opt)}, buf)
        return buf.getvalue()

    def restore(self, blob: bytes) -> None:
        saved = torch.load(io.BytesIO(blob), weights_only=False)  # written by this job's own workers
        states = saved["registered"]
        unknown = sorted(set(states) - set(self.registered))
        if unknown:
            raise ProgramError(f"state of {unknown} was saved but not registered here: call register() before the loop")
        for name, state in states.items():
            self.registered[name].load_state_dict(state)
        if self.opt is not None:
            for group, hyper in zip(self.opt.param_groups, saved["groups"], strict=True):
                for key, value in hyper.items():
                    if isinstance(group.get(key), torch.Tensor):
                        group[key].fill_(value)  # a tensor lr stays the tensor a scheduler holds
                    else:
                        group[key] = value

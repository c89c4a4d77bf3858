"""Which shape a job should have, and the decisions of changing it.

Other threads leave requests (a shape, a global batch) in :class:`Requests`;
the job's loop asks it, at a step boundary, whether to start tasks for a new
shape (:meth:`Requests.next_launch`), and tells it which requests it applied
or failed. :func:`release_plan` decides when a shape must drop tasks before its
new ones can start; :class:`PendingChange` holds the tasks a shape waits for
and says when to switch to it or give up.

Pure code: no Ray, no clock (``now`` is passed in), so every decision here is
tested with plain values (``tests/test_runtime_pieces.py``). Starting and
stopping the tasks is :mod:`elasticps.runtime.rescale`'s.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Container
from dataclasses import dataclass, field
from typing import Any, Literal

from elasticps.errors import ConfigError, PlacementError
from elasticps.runtime.reports import RescaleRecord
from elasticps.runtime.slots import match_slots

SUSPECT_NODE_S = 60.0  # Ray notices a dead raylet within ~30 s; until then do not pin to it

Kind = Literal["ps", "worker"]


@dataclass(frozen=True)
class Shape:
    """A requested job shape: counts and optional pins ``{task name: node id}``."""

    num_ps: int
    num_workers: int
    placement: dict[str, str] = field(default_factory=dict)

    def count(self, kind: Kind) -> int:
        return self.num_ps if kind == "ps" else self.num_workers

    def pins(self, kind: Kind) -> list[str | None]:
        """The node each ``kind`` slot is pinned to, as asked (None: anywhere)."""
        return [self.placement.get(task_name(kind, i)) for i in range(self.count(kind))]


def task_name(kind: str, index: int) -> str:
    return f"{kind}-{index}"


def check_shape(num_ps: int, num_workers: int, placement: dict[str, str]) -> None:
    """Raise :class:`ConfigError` for an empty shape or pins to tasks it does not have."""
    if num_ps < 1 or num_workers < 1:
        raise ConfigError(f"a job needs at least 1 PS and 1 worker, got {num_ps}x{num_workers}")
    valid = {task_name("ps", i) for i in range(num_ps)} | {task_name("worker", i) for i in range(num_workers)}
    unknown = sorted(set(placement) - valid)
    if unknown:
        raise ConfigError(f"placement names tasks that the shape {num_ps}x{num_workers} does not have: {unknown}")


@dataclass(frozen=True)
class LaunchDecision:
    """What the loop does about requests at a boundary: ``cancel`` the pending
    change (a newer request replaced it), and start tasks for ``shape``
    (request ``request_id``) if ``reason`` is set (``request``: a new request;
    ``replace``: workers died and the target wants them back)."""

    shape: Shape
    request_id: int
    cancel: bool
    reason: str | None


class Requests:
    """The shape and batch that other threads ask for, and the newest request
    applied (or failed). Every read and write holds ``lock`` (the controller's)."""

    def __init__(self, shape: Shape, lock: threading.RLock) -> None:
        self._lock = lock
        self.target = shape
        self.latest_id = 0
        self.applied = 0
        self._batch: int | None = None

    def ask(self, shape: Shape) -> int:
        """Leave a request for ``shape``; it replaces one not yet applied. Returns its id."""
        with self._lock:
            self.latest_id += 1
            self.target = shape
            return self.latest_id

    def latest(self) -> tuple[Shape, int]:
        with self._lock:
            return self.target, self.latest_id

    def ask_batch(self, batch: int) -> None:
        with self._lock:
            self._batch = batch

    def batch_asked(self) -> bool:
        with self._lock:
            return self._batch is not None

    def take_batch(self) -> int | None:
        """The global batch asked for since the last call (None: none)."""
        with self._lock:
            batch, self._batch = self._batch, None
            return batch

    def next_launch(self, pending_id: int | None, running_workers: int, replace_dead_workers: bool) -> LaunchDecision:
        """``pending_id``: the request whose tasks are starting (None: none)."""
        with self._lock:
            shape, request_id, applied = self.target, self.latest_id, self.applied
        cancel = pending_id is not None and pending_id != request_id
        reason = None
        if pending_id is None or cancel:
            if request_id > applied:
                reason = "request"
            elif replace_dead_workers and running_workers < shape.num_workers:
                reason = "replace"  # after failures: fewer workers than the target
        return LaunchDecision(shape, request_id, cancel, reason)

    def unlaunched(self, pending_id: int | None) -> bool:
        """A request newer than the applied one whose tasks have not been started."""
        with self._lock:
            return pending_id is None and self.latest_id > self.applied

    def mark_applied(self, request_id: int) -> None:
        with self._lock:
            self.applied = max(self.applied, request_id)

    def mark_failed(self, request_id: int, current: Shape) -> None:
        """Request ``request_id`` failed: if it is the newest, the target becomes
        the shape the job has (``current``), so that nothing retries it."""
        with self._lock:
            self.applied = max(self.applied, request_id)
            if self.latest_id == request_id:
                self.target = current


def rescale_outcome(request_id: int, records: list[RescaleRecord], applied: int, ended: bool) -> RescaleRecord | None:
    """The record of request ``request_id`` once applied; None while it may
    still be. Raises if it failed, was superseded, or the job ended first."""
    for rec in records:
        if rec.request_id == request_id:
            if not rec.ok:
                raise PlacementError(rec.error or "rescale failed")
            return rec
    if applied > request_id or ended:
        raise ConfigError(f"rescale request {request_id} was superseded or the job ended")
    return None


class SuspectNodes:
    """Nodes where tasks died, and when: a raylet may be dead before Ray says
    so, so a pin to one counts as no pin for ``hold_s``."""

    def __init__(self, hold_s: float = SUSPECT_NODE_S) -> None:
        self.hold_s = hold_s
        self._since: dict[str, float] = {}

    def mark(self, nodes: list[str], now: float) -> None:
        self._since.update(dict.fromkeys(nodes, now))

    def suspect(self, node: str, now: float) -> bool:
        since = self._since.get(node)
        return since is not None and now - since < self.hold_s


def wanted(kind: Kind, shape: Shape, alive: Container[str], suspect: Callable[[str], bool]) -> list[str | None]:
    """The node each ``kind`` slot of ``shape`` is pinned to (None: anywhere;
    a gone or suspect node counts as anywhere)."""
    return [n if n is not None and n in alive and not suspect(n) else None for n in shape.pins(kind)]


@dataclass(frozen=True)
class ReleasePlan:
    """Switch first to the running tasks a new shape keeps: ``{new slot: running index}``."""

    keep_ps: dict[int, int]
    keep_workers: dict[int, int]
    drops: int


def release_plan(
    have: dict[Kind, list[str]],
    want: dict[Kind, list[str | None]],
    resources: dict[Kind, dict[str, float]],
    fits: Callable[[list[tuple[str, dict[str, float]]]], bool],
) -> ReleasePlan | None:
    """Break before make where make-before-break cannot work.

    ``have[kind]``: the nodes of the running tasks; ``want[kind]``: the pins of
    the new shape (see :func:`wanted`); ``fits(needs)``: whether new tasks
    ``[(node, resources)]`` have room now (asked only when it matters). If the
    shape drops running tasks and needs new pinned ones, and those have no
    room, the plan is to switch to the tasks it keeps first (their room is
    then free for the new ones; the full shape follows once they run).
    Without this, a shape that trades a worker for a PS, or moves tasks, on a
    full cluster waits for room that only its own old tasks hold, and fails.
    None: start the new tasks beside the running ones.
    """
    keep: dict[Kind, dict[int, int]] = {}
    new: list[tuple[str, dict[str, float]]] = []
    for kind in ("ps", "worker"):
        keep[kind] = match_slots(have[kind], want[kind])
        new += [
            (node, resources[kind]) for i, node in enumerate(want[kind]) if i not in keep[kind] and node is not None
        ]
    drops = len(have["ps"]) + len(have["worker"]) - len(keep["ps"]) - len(keep["worker"])
    if not drops or not new or not keep["ps"] or not keep["worker"] or fits(new):
        return None
    return ReleasePlan(keep["ps"], keep["worker"], drops)


@dataclass
class PendingChange:
    """A shape whose new tasks are starting: ``new_*`` ``{slot: pending task}``,
    ``kept_*`` ``{slot: running task that fills it}``."""

    request_id: int
    shape: Shape
    new_ps: dict[int, Any]
    new_workers: dict[int, Any]
    launched_at: float
    reason: str
    kept_ps: dict[int, Any] = field(default_factory=dict)
    kept_workers: dict[int, Any] = field(default_factory=dict)

    def starting(self) -> list[Any]:
        """Its new tasks: PS first, then workers (the order :meth:`names` and an install use)."""
        return [*self.new_ps.values(), *self.new_workers.values()]

    def names(self) -> list[str]:
        return [task_name("ps", i) for i in self.new_ps] + [task_name("worker", i) for i in self.new_workers]

    def stale(self, running: list[Any]) -> bool:
        """Whether it keeps a task that is not among ``running`` any more (a
        recovery removed or replaced it): switching to it would bring that task back."""
        alive = {id(t) for t in running}
        return any(id(t) not in alive for t in [*self.kept_ps.values(), *self.kept_workers.values()])

    def verdict(self, all_running: bool, now: float, timeout_s: float) -> Literal["apply", "give_up"] | None:
        """At a boundary: switch to it once every new task runs; give up after
        ``timeout_s``; else wait (None)."""
        if all_running:
            return "apply"
        if now - self.launched_at > timeout_s:
            return "give_up"
        return None

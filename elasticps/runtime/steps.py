"""The PS step protocol: one ``sync`` step, or one segment of ``async`` steps.

Per ``sync`` step t with P shards and W workers::

    worker w: params <- ray.get(param refs of step t)      (pull)
              g_w    <- grad(sum of loss over its samples) / M   (compute)
              returns [stats, g_w[shard 0], ..., g_w[shard P-1]]  (push)
    shard j:  p_j    <- opt(p_j, sum_w g_w[shard j])        (update)
              returns p_j, which are the param refs of step t+1

The sum over workers is the global-batch mean gradient whatever W is, and the
optimizers are elementwise, so the update does not depend on (P, W).

These functions make the Ray calls of steps on a fixed :class:`TaskGroup` and
say what came back; they change neither the group nor the job's step. The
caller (the controller) accounts a step that stands and recovers from one that
failed, between two steps: a shard applies a step whole or not at all, and
:class:`SyncResult` says whether every shard, none or some applied it (the
last leaves the shards torn, which :mod:`elasticps.runtime.recovery` restores).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import ray

from elasticps.runtime import tasks
from elasticps.runtime.bounded_get import hung_in
from elasticps.runtime.config import JobConfig
from elasticps.runtime.data import split_evenly
from elasticps.runtime.membership import task_name
from elasticps.runtime.task_group import TaskGroup


def worker_seed(seed: int, step: int, rank: int) -> int:
    """Seed of a worker's torch RNG at a step (dropout masks and the like)."""
    return (seed * 1_000_003 + step * 7919 + rank) % (2**63)


@dataclass(frozen=True)
class Waits:
    """How long a step's calls may take (``step_s``: the job's
    ``step_timeout_s``), and how long calls that waited on a task taken for
    hung may then take to fail (``grace_s``: its ``liveness_timeout_s``).
    A task that does not answer in time is killed and the step fails
    (:func:`tasks.answers`): the job recovers as when it dies."""

    step_s: float
    grace_s: float

    @classmethod
    def of(cls, config: JobConfig) -> Waits:
        return cls(config.step_timeout_s, config.liveness_timeout_s)


@dataclass
class SyncResult:
    """What one sync step gave back.

    ``done``: the workers whose statistics came back, with them; ``infos``:
    each shard's update statistics (None: its update failed); ``param_refs``:
    each shard's parameters after the step; ``stats_error``/``apply_error``:
    the first error of the workers' and of the shards' calls."""

    done: list[tuple[tasks.Task, dict[str, Any]]]
    infos: list[dict[str, float] | None]
    param_refs: list[Any]
    stats_error: ray.exceptions.RayError | None
    apply_error: ray.exceptions.RayError | None

    @property
    def applied(self) -> int:
        return sum(i is not None for i in self.infos)

    @property
    def complete(self) -> bool:
        """Every shard applied the step: it stands (even if a worker died after its gradient was in)."""
        return self.applied == len(self.infos)

    @property
    def hung(self) -> tuple[str, ...]:
        """The tasks either error takes for hung."""
        return hung_in(self.stats_error, self.apply_error)


def sync_step(
    group: TaskGroup,
    step: int,
    idx: np.ndarray,
    upcoming: np.ndarray | None,
    lr: float,
    seed: int,
    measure: bool,
    loop: tuple[int, dict[int, bytes | None]] | None = None,
    waits: Waits | None = None,
) -> SyncResult:
    """One bulk-synchronous step on global batch ``idx``. Updates are submitted
    with the worker calls; each shard waits for the gradients itself, so a step
    costs the caller one round trip.

    ``upcoming``: what the workers most likely read next (read while this step
    runs). ``loop``: for a user's own loop, ``(epoch, {id(worker handle):
    registered state for its first step})``: every worker's loop takes part,
    if only with a padding sample, the lr and other hyperparameters come from
    the first worker's optimizer, and ``lr`` is the factor the shards multiply
    its lrs by (the adaptive batch's, :meth:`LoopProgram.lr_at`).

    ``waits``: the step's calls are waited for at most ``waits.step_s``
    (default: :class:`JobConfig`'s); the shards' sums and updates, once a
    worker or a shard failed (died, or was taken for hung), at least
    ``waits.grace_s`` to fail on its lost gradient or norm."""
    waits = waits or Waits.of(JobConfig())
    deadline = time.monotonic() + waits.step_s
    ps, workers = group.ps, group.workers
    nexts = split_evenly(upcoming, len(workers)) if upcoming is not None else [None] * len(workers)
    calls = []
    for rank, (w, part, nxt) in enumerate(zip(workers, split_evenly(idx, len(workers)), nexts, strict=True)):
        extra = {}
        if loop is not None:
            epoch, joiners = loop
            extra = {"epoch": epoch, "pad": len(part) == 0, "user_state": joiners.get(id(w.handle))}
            part = part if len(part) else idx[:1]
        if len(part) == 0:
            continue
        refs = w.handle.step.options(num_returns=len(ps) + 1).remote(
            step,
            part,
            group.param_refs,
            group.bounds,
            len(idx),
            worker_seed(seed, step, rank),
            measure,
            [p.node_id == w.node_id for p in ps],
            nxt,
            **extra,
        )
        calls.append((rank, w, refs))
    factor: dict[str, float] = {}
    if loop is not None:  # the lr and other hyperparameters of the user's optimizer: from the first worker
        factor = {"lr_factor": lr}  # a float beside the stats ref, which Ray resolves as a top-level argument
        lr = calls[0][2][0]
    grads = [[refs[j + 1] for _, _, refs in calls] for j in range(len(ps))]
    senders = [task_name("worker", rank) for rank, _, _ in calls]  # a gradient's place is not its worker's
    norms = None
    if loop is not None and len(ps) > 1:  # shards sum first and share their norms: a loop may clip globally
        norms = [p.handle.reduce.remote(step, g, lr, senders) for p, g in zip(ps, grads, strict=True)]
        grads = [[] for _ in ps]
    applies = [
        p.handle.apply.options(num_returns=2).remote(
            step,
            grads[j],
            measure,
            any(w.node_id != p.node_id for w in workers),
            lr,
            *([norms] if norms is not None else []),
            **factor,
            senders=senders,
        )
        for j, p in enumerate(ps)
    ]
    within = f"within {waits.step_s:g} s (step_timeout_s)"
    stats, stats_error = tasks.answers(
        [(task_name("worker", rank), w.handle, refs[0]) for rank, w, refs in calls],
        deadline - time.monotonic(),
        f"hand in its gradient of step {step} {within}",
    )

    def left(*failed: ray.exceptions.RayError | None) -> float:
        """The step's time left; after a task failed, at least the grace to fail on what it lost."""
        return max(deadline - time.monotonic(), waits.grace_s if any(e is not None for e in failed) else 0.0)

    sum_error = None
    if norms is not None:  # a shard hung in its sum is stopped alone: the others' updates then fail on its norm
        _, sum_error = tasks.answers(
            [(task_name("ps", j), p.handle, ref) for j, (p, ref) in enumerate(zip(ps, norms, strict=True))],
            left(stats_error),
            f"sum the gradients of step {step} {within}",
        )
    infos, apply_error = tasks.answers(
        [(task_name("ps", j), p.handle, a[0]) for j, (p, a) in enumerate(zip(ps, applies, strict=True))],
        left(stats_error, sum_error),
        f"apply step {step} {within}",
    )
    if isinstance(sum_error, ray.exceptions.GetTimeoutError):  # the shard it names is why the updates failed
        apply_error = sum_error
    done = [(w, s) for (_, w, _), s in zip(calls, stats, strict=True) if s is not None]
    return SyncResult(done, infos, [a[1] for a in applies], stats_error, apply_error)


@dataclass
class AsyncFailure:
    """A failed async step: the error, and whether it hit the update (shards may be torn)."""

    error: ray.exceptions.RayError
    ps_inconsistent: bool


class _InFlight(NamedTuple):
    """An async step in flight: its worker, the refs it returns, the step its parameters are of, and when it left."""

    rank: int
    worker: tasks.Task
    refs: list[Any]
    version: int
    t0: float


def async_segment(
    group: TaskGroup,
    seed: int,
    step: Callable[[], int],
    hand_out: Callable[[], np.ndarray],
    keep_going: Callable[[], bool],
    lr: Callable[[], float],
    max_staleness: int | None,
    waits: Waits,
    applied: Callable[[dict[str, Any], list[dict[str, float]], tasks.Task, float], None],
    discarded: Callable[[int, int], None],
) -> AsyncFailure | None:
    """Async steps until ``keep_going()`` says stop, then drain.

    Each worker always has one step in flight. When one returns, its gradient
    is applied at once (unless staler than ``max_staleness``: then
    ``discarded(rank, staleness)``), ``applied(stats, infos, worker, wall_s)``
    is told (it moves ``step()`` on), and the worker gets the next samples
    (``hand_out()``, which moves the data position) with the newest
    parameters. After a failure, the steps in flight are let finish and the
    failure is returned; samples that were in flight are not revisited (async
    training is not exact anyway). A worker's step or the shards' update of
    it that takes longer than ``waits.step_s`` is a failure too: the tasks
    late are taken for hung (:func:`tasks.answers`); the others in flight get
    ``waits.grace_s`` to finish."""
    in_flight: dict[Any, _InFlight] = {}  # by the ref of its statistics

    def dispatch(rank: int, w: tasks.Task) -> None:
        idx = hand_out()
        at = step()
        refs = w.handle.step.options(num_returns=len(group.ps) + 1).remote(
            at, idx, group.param_refs, group.bounds, len(idx), worker_seed(seed, at, rank)
        )
        in_flight[refs[0]] = _InFlight(rank, w, refs, at, time.perf_counter())

    def drain() -> None:
        """Let in-flight steps finish (or fail) so that no one writes behind our back."""
        if in_flight:
            ray.wait(list(in_flight), num_returns=len(in_flight), timeout=waits.grace_s)
        in_flight.clear()

    for rank, w in enumerate(group.workers):
        if keep_going():
            dispatch(rank, w)
    while in_flight:
        oldest = min(e.t0 for e in in_flight.values())
        ready, _ = ray.wait(
            list(in_flight), num_returns=1, timeout=max(0.0, oldest + waits.step_s - time.perf_counter())
        )
        if not ready:  # the oldest step ran out of time: it, and any as old, are taken for hung
            now = time.perf_counter()
            late = [(ref, e) for ref, e in in_flight.items() if e.t0 == oldest or now - e.t0 >= waits.step_s]
            _, error = tasks.answers(
                [(task_name("worker", e.rank), e.worker.handle, ref) for ref, e in late],
                0.0,
                f"hand in a step within {waits.step_s:g} s (step_timeout_s)",
            )
            if error is None:  # it came just now
                continue
            drain()
            return AsyncFailure(error, ps_inconsistent=False)
        rank, w, refs, version, t0 = in_flight.pop(ready[0])
        try:
            stats = ray.get(ready[0])
        except ray.exceptions.RayError as exc:
            drain()
            return AsyncFailure(exc, ps_inconsistent=False)
        staleness = step() - version
        if max_staleness is not None and staleness > max_staleness:
            discarded(rank, staleness)
        else:
            applies = [
                p.handle.apply.options(num_returns=2).remote(
                    step(), [refs[j + 1]], False, True, lr(), senders=[task_name("worker", rank)]
                )
                for j, p in enumerate(group.ps)
            ]
            infos, error = tasks.answers(
                [(task_name("ps", j), p.handle, a[0]) for j, (p, a) in enumerate(zip(group.ps, applies, strict=True))],
                waits.step_s,
                f"apply an async step of {task_name('worker', rank)} within {waits.step_s:g} s (step_timeout_s)",
            )
            if error is not None:
                drain()
                return AsyncFailure(error, ps_inconsistent=True)
            group.stepped([a[1] for a in applies])
            applied(stats, infos, w, time.perf_counter() - t0)
        if keep_going():
            dispatch(rank, w)
    return None

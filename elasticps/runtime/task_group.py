"""The job's running tasks: its PS shards and workers, and the parameters of its next step.

A :class:`TaskGroup` is the one place that replaces the task lists. The
job's loop changes them only between two steps (an install, or dropping dead
tasks after a failed step); other threads read them, under the controller's
lock, for a report.

It also keeps the shards' whole state as last gathered or installed, with its
step, until a step moves the shards on (:meth:`TaskGroup.stepped`): a PS that
dies before then is restored from it with no step lost
(:meth:`TaskGroup.state_at`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import ray
from ray.exceptions import GetTimeoutError

from elasticps.runtime import tasks
from elasticps.runtime.flat import shard_bounds
from elasticps.runtime.membership import Shape, task_name
from elasticps.runtime.shard_state import ShardState, concat_shards


class TaskGroup:
    """``ps`` and ``workers`` in slot order; ``param_refs``: each shard's
    parameters for the next step (``bounds``: its flat range).

    ``on_join(workers)``: called with the workers an install adds, before it
    changes anything (a user's loop snapshots the state they start from).
    ``timeout_s``: how long the shards may take to hand over or take in the
    state or the parameters; one that does not answer in time fails the read
    with :class:`~ray.exceptions.GetTimeoutError` naming it (a Ray error:
    the job recovers as when a task dies). ``park(dropped)``: takes tasks an
    install drops (as standbys) and returns those it leaves to retire."""

    def __init__(
        self,
        lock: threading.RLock,
        on_join: Callable[[list[tasks.Task]], None] | None = None,
        timeout_s: float = 60.0,
        park: Callable[[list[tasks.Task]], list[tasks.Task]] | None = None,
    ) -> None:
        self.lock = lock  # the controller's: other threads read the lists under it
        self._on_join = on_join
        self._park = park
        self.timeout_s = timeout_s
        self.ps: list[tasks.Task] = []
        self.workers: list[tasks.Task] = []
        self.param_refs: list[Any] = []
        self.bounds: list[tuple[int, int]] = []
        self.nodes_used: set[str] = set()  # where the job's tasks ran: swept at shutdown
        self._state: tuple[int, ShardState] | None = None  # (step, the shards' whole state then)

    def placement(self) -> dict[str, str]:
        """Where every task runs: ``{"ps-0": node id, "worker-0": node id, ...}``."""
        return {name: t.node_id for name, t in self._by_name().items()}

    def stop(self, names: Iterable[str]) -> list[tasks.Task]:
        """Kill the running tasks of ``names`` (``ps-1``, ``worker-0``: their
        slots), taken for hung; they stay in the lists, for a recovery to take
        for dead. Returns them (Ray carries a kill out asynchronously: a ping
        just after it may still be answered)."""
        by_name = self._by_name()
        stopped = [by_name[name] for name in names if name in by_name]
        for t in stopped:
            tasks.kill(t.handle)
        return stopped

    def _by_name(self) -> dict[str, tasks.Task]:
        out = {task_name("ps", i): t for i, t in enumerate(self.ps)}
        out.update({task_name("worker", i): t for i, t in enumerate(self.workers)})
        return out

    def counts(self) -> tuple[int, int]:
        return len(self.ps), len(self.workers)

    def shards_change(self, ps: list[Any]) -> bool:
        """Whether ``ps`` (the PS of a new shape, slot by slot) is not the running
        PS list as it is: new, fewer, more or reordered shards, cut again."""
        return [id(t) for t in ps] != [id(t) for t in self.ps]

    def gather_state(self, step: int) -> ShardState:
        """The shards' whole state; ``step``: the job's step now (the state is kept for :meth:`state_at`)."""
        state = concat_shards(self._answers([t.handle.get_state.remote() for t in self.ps], "hand over their state"))
        self._state = (step, state)
        return state

    def state_at(self, step: int) -> ShardState | None:
        """The shards' whole state at ``step`` if it was gathered or installed
        then and no step applied since (None: not known)."""
        kept = self._state
        return kept[1] if kept is not None and kept[0] == step else None

    def stepped(self, param_refs: list[Any]) -> None:
        """A step applied: ``param_refs`` are the shards' parameters for the next one."""
        self.param_refs = param_refs
        self._state = None

    def parameters(self) -> np.ndarray:
        """A copy of the current flat parameters, gathered from the PS shards."""
        return np.concatenate(self._answers([t.handle.params.remote() for t in self.ps], "hand over their parameters"))

    def _answers(self, refs: list[Any], what: str) -> list[Any]:
        """What the PS shards (``refs``: one call to each, slot by slot) answer,
        waited for at most ``timeout_s``."""
        try:
            return ray.get(refs, timeout=self.timeout_s)
        except GetTimeoutError as exc:
            _, late = ray.wait(refs, num_returns=len(refs), timeout=0)
            names = ", ".join(task_name("ps", i) for i, ref in enumerate(refs) if ref in late)
            raise GetTimeoutError(f"PS shard(s) {names} did not {what} within {self.timeout_s:g} s") from exc

    def install(
        self,
        shape: Shape,
        new_ps: dict[int, tasks.Task],
        new_workers: dict[int, tasks.Task],
        state: ShardState | None,
        step: int,
    ) -> None:
        """Make ``shape`` current: slot ``i`` is ``new_*[i]``, else the running
        task ``i``. If ``state`` is given, (re)shard it over the PS as of
        ``step``. Tasks the shape does not keep are retired."""
        ps = [new_ps.get(i) or self.ps[i] for i in range(shape.num_ps)]
        workers = [new_workers.get(i) or self.workers[i] for i in range(shape.num_workers)]
        joining = [w for w in workers if all(w.handle is not t.handle for t in self.workers)]
        if self._on_join is not None and joining:
            self._on_join(joining)
        if state is not None:
            bounds = shard_bounds(state.numel, len(ps))
            refs = [
                t.handle.set_state.remote(state.slice(lo, hi), step, lo) for t, (lo, hi) in zip(ps, bounds, strict=True)
            ]
            self._answers(refs, f"take in the state of step {step}")
            self.param_refs, self.bounds = refs, bounds
            self._state = (step, state)
        keep = {id(t.handle) for t in ps + workers}
        dropped = [t for t in self.ps + self.workers if id(t.handle) not in keep]
        tasks.retire_tasks(self._park(dropped) if self._park is not None else dropped)
        self.nodes_used.update(t.node_id for t in ps + workers)
        with self.lock:
            self.ps, self.workers = ps, workers

    def remove(self, dead: list[tasks.Task]) -> None:
        """Kill ``dead`` and drop them from the lists (the slots after them move up)."""
        for t in dead:
            tasks.stop(t)
        with self.lock:
            self.ps = [t for t in self.ps if t not in dead]
            self.workers = [t for t in self.workers if t not in dead]

    def retire_all(self) -> None:
        """Stop every task (:meth:`sweep` then cleans up after them)."""
        tasks.retire_tasks(self.ps + self.workers)
        self.nodes_used.update(t.node_id for t in self.ps + self.workers)
        self.ps, self.workers, self.param_refs = [], [], []
        self._state = None

    def sweep(self) -> None:
        """Remove the shared memory that dead tasks left on every node the job used."""
        tasks.sweep_nodes(self.nodes_used)

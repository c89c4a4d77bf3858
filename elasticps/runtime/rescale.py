"""Changing a running job's shape: starting, switching to and releasing tasks.

A request's new tasks start while the job trains (make before break); the
job's loop calls :meth:`Rescaler.at_boundary` between two steps, and only there
does the shape change: the running shards' state is gathered, re-cut over the
new PS list and installed before the next step reads it, so no step sees half
a shape. Tasks of one kind are interchangeable, so a running task on the node
a slot wants fills it (:func:`~elasticps.runtime.slots.match_slots`) and a
shrink starts nothing; a new worker's slot takes a standby worker, started
ahead, where there is one (:mod:`~elasticps.runtime.standby`).

The decisions (which request to act on, when to release first, when to give
up) are :mod:`elasticps.runtime.membership`'s; this module carries them out
on Ray.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ray

from elasticps.errors import PlacementError, error_text
from elasticps.runtime import tasks
from elasticps.runtime.config import JobConfig, TaskResources
from elasticps.runtime.membership import (
    Kind,
    PendingChange,
    Requests,
    Shape,
    SuspectNodes,
    release_plan,
    rescale_outcome,
    task_name,
    wanted,
)
from elasticps.runtime.reports import RescaleRecord
from elasticps.runtime.shard_state import ShardState
from elasticps.runtime.slots import fits_now, match_slots
from elasticps.runtime.standby import StandbyPool
from elasticps.runtime.task_group import TaskGroup


@dataclass(frozen=True)
class JobHooks:
    """What the runtime's pieces call back on their job: ``event(text)``
    records an event at the job's step, ``flush_window()`` closes the window
    being measured (a window measures one shape), ``step()`` is the job's step now."""

    event: Callable[[str], None]
    flush_window: Callable[[], None]
    step: Callable[[], int]


MAX_SWITCH_FAILURES = 3  # a request whose tasks die this often while switched in fails


class SwitchFailed(Exception):
    """A task died (or failed) while a shape change was switched in at a boundary.

    ``request_id``/``shape``: the change's request; ``starting``: its new
    tasks, pending (to stop: the change is off); ``state``: the shards' whole
    state, gathered at this step before the install failed (the install may
    have re-cut some shards, so they are torn; None: nothing was gathered, the
    shards are as the last step left them); ``cause``: the error."""

    def __init__(
        self, request_id: int, shape: Shape, starting: list[Any], state: ShardState | None, cause: Exception
    ) -> None:
        self.cause_text = error_text(cause)
        super().__init__(f"switching to {shape.num_ps}x{shape.num_workers} failed: {self.cause_text}")
        self.request_id, self.shape, self.starting, self.state, self.cause = request_id, shape, starting, state, cause


class Rescaler:
    """Carries a job's rescale ``requests`` out on ``group``."""

    def __init__(self, program: Any, config: JobConfig, group: TaskGroup, requests: Requests, hooks: JobHooks) -> None:
        self.program = program
        self.config = config
        self.group = group
        self.requests = requests
        self._lock = group.lock
        self._event, self._flush, self._step = hooks.event, hooks.flush_window, hooks.step
        self.pending: PendingChange | None = None
        self.records: list[RescaleRecord] = []  # every shape change and failed request, in order
        self._switch_failures: dict[int, int] = {}  # request id: how often its switch failed
        self.suspects = SuspectNodes()  # nodes where tasks died: not pinned to for a while
        self.dataset_ref: Any = None  # the training set in the object store, for new workers (None: they build it)
        self.standby: StandbyPool | None = None  # workers started ahead, taken before fresh ones (the job's)

    def _resources(self, kind: Kind) -> Any:
        return self.config.ps_resources if kind == "ps" else self.config.worker_resources

    # ----------------------------------------------------------- requests
    def request(self, shape: Shape) -> int:
        """Leave a request for ``shape``; pins to unknown or too-small nodes fail at once."""
        if shape.placement:
            nodes = tasks.alive_nodes()
            for name, node in shape.placement.items():
                tasks.check_fits(name, node, self._resources("ps" if name.startswith("ps-") else "worker"), nodes)
        return self.requests.ask(shape)

    def wait(self, request_id: int, timeout_s: float, ended: Callable[[], bool]) -> RescaleRecord:
        """Block until request ``request_id`` is applied; raise if it failed."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                rec = rescale_outcome(request_id, self.records, self.requests.applied, ended())
            if rec is not None:
                return rec
            time.sleep(0.02)
        raise TimeoutError(f"rescale request {request_id} not applied within {timeout_s:g} s")

    def starting(self) -> dict[str, str]:
        """Tasks of a pending rescale that have been started on a pinned node but
        are not in use yet: ``{task name: node id}`` (they already hold resources)."""
        pending = self.pending
        if pending is None:
            return {}
        out = {task_name("ps", i): p.wanted_node for i, p in pending.new_ps.items() if p.wanted_node}
        out.update({task_name("worker", i): p.wanted_node for i, p in pending.new_workers.items() if p.wanted_node})
        return out

    def pending_ready(self) -> bool:
        """Whether a boundary now would change the shape (or start doing so)."""
        pending = self.pending
        if self.requests.unlaunched(None if pending is None else pending.request_id):
            return True
        if pending is None:
            return False
        return tasks.all_ready(pending.starting())

    # ------------------------------------------------------ at a boundary
    def at_boundary(self) -> None:
        """Start the tasks of the newest request, then switch to a pending
        shape whose tasks all run, or fail it once it waited too long."""
        self.launch_pending()
        pending = self.pending
        if pending is None:
            return
        started = pending.starting()
        verdict = pending.verdict(tasks.all_ready(started), time.monotonic(), self.config.placement_timeout_s)
        if verdict == "give_up" and self._swap_late_standbys(pending):
            return  # fresh workers in the slots of standbys whose reservation did not come: waited for as long
        if verdict == "apply":
            self.pending = None
            self._apply_change(pending)
        elif verdict == "give_up":
            self.pending = None
            waited = time.monotonic() - pending.launched_at
            error = tasks.give_up(started, pending.names(), waited)
            self.fail_request(pending.request_id, pending.shape, str(error), waited)

    def launch_pending(self) -> None:
        """Start the tasks of the newest request (or of replacements) if not started yet."""
        pending = self.pending
        decision = self.requests.next_launch(
            None if pending is None else pending.request_id, len(self.group.workers), self.config.replace_dead_workers
        )
        if decision.cancel:
            self.cancel_pending()
        if decision.reason is not None:
            try:
                self._release_first(decision.shape, decision.request_id)
                self.pending = self.launch(
                    decision.shape, decision.request_id, decision.reason, strict=False, while_training=True
                )
            except PlacementError as exc:
                self.fail_request(decision.request_id, decision.shape, str(exc), 0.0)

    def prepare(self, timeout_s: float | None = None) -> bool:
        """Start the tasks of the newest request and wait (at most ``timeout_s``)
        until they run; returns whether everything is running."""
        self.launch_pending()
        if self.pending is None:
            return True
        started = [p.ready_ref for p in self.pending.starting()]
        timeout = self.config.placement_timeout_s if timeout_s is None else timeout_s
        _, not_ready = ray.wait(started, num_returns=len(started), timeout=timeout)
        return not not_ready

    # ------------------------------------------------------------ actions
    def launch(
        self, shape: Shape, request_id: int, reason: str, strict: bool, while_training: bool = False
    ) -> PendingChange:
        """Start the tasks that ``shape`` needs beyond the running ones it keeps
        (a running task on the node a slot wants fills it). ``strict``: a pin
        to a gone node is an error, not a task Ray places anywhere.
        ``while_training``: the job trains on while they start (see :meth:`start_task`)."""
        nodes = tasks.alive_nodes() if shape.placement else {}
        new: dict[Kind, dict[int, tasks.PendingTask]] = {"ps": {}, "worker": {}}
        kept: dict[Kind, dict[int, tasks.Task]] = {"ps": {}, "worker": {}}
        current: dict[Kind, list[tasks.Task]] = {"ps": self.group.ps, "worker": self.group.workers}
        claimed: list[tuple[str, dict[str, float]]] = []  # what the standbys taken will reserve
        suspect = self._suspect()
        kind: Kind
        try:
            for kind in ("ps", "worker"):
                want = self._wanted(kind, shape, nodes)
                for i, (pin, node) in enumerate(zip(shape.pins(kind), want, strict=True)):
                    if pin is not None and node is None:
                        if strict:
                            tasks.check_fits(task_name(kind, i), pin, self._resources(kind), nodes)
                        self._event(f"{task_name(kind, i)}: pinned node {pin} is gone; letting Ray place it")
                have = current[kind]
                match = match_slots([t.node_id for t in have], want)
                kept[kind] = {i: have[j] for i, j in match.items()}
                for i, node in enumerate(want):
                    if i in match:
                        continue
                    if node is not None:
                        tasks.check_fits(task_name(kind, i), node, self._resources(kind), nodes)
                    pool = self.standby if kind == "worker" else None
                    taken = pool.take(node, self._resources(kind), claimed, suspect) if pool is not None else None
                    new[kind][i] = taken or self.start_task(
                        kind, self._resources(kind), node, task_name(kind, i), while_training
                    )
        except PlacementError:
            for p in [*new["ps"].values(), *new["worker"].values()]:
                tasks.stop(p)
            raise
        return PendingChange(
            request_id, shape, new["ps"], new["worker"], time.monotonic(), reason, kept["ps"], kept["worker"]
        )

    def start_task(
        self, kind: Kind, resources: TaskResources, node: str | None, name: str, while_training: bool = False
    ) -> tasks.PendingTask:
        """Start a fresh ``kind`` task asking Ray for ``resources`` (on ``node`` if given).
        ``while_training``: the job trains on while it starts, so its imports
        run at idle priority (``JobConfig.import_at_idle``) for up to half of
        ``placement_timeout_s``; a job's start or a restore, which wait for it,
        start it as usual (and may take a process Ray started ahead)."""
        idle = self.config.import_at_idle and while_training
        return tasks.launch(
            kind,
            self.program,
            resources,
            self.config.ps_threads if kind == "ps" else self.config.worker_threads,
            node,
            shared_memory=self.config.mode == "sync" and self.config.shared_memory,
            dataset=self.dataset_ref,
            name=name,
            wait_s=self.config.step_timeout_s,
            idle_import_s=self.config.placement_timeout_s / 2 if idle else None,
        )

    def _swap_late_standbys(self, pending: PendingChange) -> bool:
        pins = self._wanted("worker", pending.shape, tasks.alive_nodes() if pending.shape.placement else {})
        start = lambda i: self.start_task("worker", self.config.worker_resources, pins[i], task_name("worker", i))  # noqa: E731
        n = self.standby.swap_late(pending.new_workers, start) if self.standby is not None else 0
        if n:
            pending.launched_at = time.monotonic()
            self._event(f"{n} standby worker(s) got no room on their node: fresh workers take their slots")
        return n > 0

    def _wanted(self, kind: Kind, shape: Shape, nodes: dict[str, dict[str, float]]) -> list[str | None]:
        return wanted(kind, shape, nodes, self._suspect())

    def _suspect(self) -> Callable[[str], bool]:
        """Whether a node is suspect now (tasks died there lately)."""
        now = time.monotonic()
        return lambda node: self.suspects.suspect(node, now)

    def _release_first(self, shape: Shape, request_id: int) -> None:
        """Switch to the running tasks ``shape`` keeps first, if its new tasks
        have no room beside the old ones (see :func:`membership.release_plan`)."""
        group = self.group
        nodes = tasks.alive_nodes() if shape.placement else {}
        plan = release_plan(
            {"ps": [t.node_id for t in group.ps], "worker": [t.node_id for t in group.workers]},
            {"ps": self._wanted("ps", shape, nodes), "worker": self._wanted("worker", shape, nodes)},
            {kind: self._resources(kind).as_ray_resources() for kind in ("ps", "worker")},  # type: ignore[misc]
            lambda new: fits_now(new, tasks.free_now()),
        )
        if plan is None:
            return
        ps = [group.ps[j] for _, j in sorted(plan.keep_ps.items())]
        workers = [group.workers[j] for _, j in sorted(plan.keep_workers.items())]
        self._flush()
        t0 = time.perf_counter()
        before = group.counts()
        kept = Shape(len(ps), len(workers))
        self._switch(
            request_id,
            shape,
            [],
            ps,
            lambda state: group.install(kept, dict(enumerate(ps)), dict(enumerate(workers)), state, self._step()),
        )
        pause = time.perf_counter() - t0
        with self._lock:
            self.records.append(
                RescaleRecord(0, before, (len(ps), len(workers)), self._step(), pause, 0.0, True, reason="release")
            )
        self._event(
            f"released {plan.drops} task(s) ahead of the rescale to {shape.num_ps}x{shape.num_workers}: "
            f"{before[0]}x{before[1]} -> {len(ps)}x{len(workers)} until its new tasks run (no room for them yet)"
        )

    def cancel_pending(self) -> None:
        assert self.pending is not None
        for p in self.pending.starting():
            if p.reservation is not None and self.standby is not None:
                self.standby.put_back(p)  # a standby: back to the pool, not stopped
            else:
                tasks.stop(p)
        self.pending = None

    def drop_stale(self) -> None:
        """Cancel a pending change that keeps tasks a recovery removed. Its
        request stays unapplied, so the next boundary starts it again against
        the tasks there are."""
        pending = self.pending
        if pending is None or not pending.stale(self.group.ps + self.group.workers):
            return
        self.cancel_pending()
        shape = pending.shape
        self._event(f"the rescale to {shape.num_ps}x{shape.num_workers} kept tasks that are gone: starting it again")

    def drop_unapplied(self, ended: str) -> None:
        """The job ``ended`` (failed, stopped, finished) with a request not applied
        (its tasks starting, or not started yet): it is dropped with the job, and
        the job's log says so after the line that asked for it."""
        with self._lock:
            shape, request_id = self.requests.latest()
            unapplied = request_id > self.requests.applied
        if unapplied:
            self._event(f"the rescale to {shape.num_ps}x{shape.num_workers} was dropped: the job {ended} first")

    def switch_failed(self, failed: SwitchFailed, job_error: str | None) -> None:
        """After the recovery from ``failed``: its request stays unapplied, so the
        next boundary starts it again against the tasks there are; it fails
        once its switch failed ``MAX_SWITCH_FAILURES`` times or the job failed
        (``job_error``). A replacement of dead workers has no request of its own:
        the target stands and is started again."""
        rid, shape = failed.request_id, failed.shape
        n = self._switch_failures[rid] = self._switch_failures.get(rid, 0) + 1
        if rid <= self.requests.applied:
            return
        if job_error is not None:
            self.fail_request(rid, shape, job_error, 0.0)
        elif n >= MAX_SWITCH_FAILURES:
            error = f"a task died while it was switched in, {n} times (the last: {failed.cause_text})"
            self.fail_request(rid, shape, error, 0.0)
        else:
            self._event(f"the rescale to {shape.num_ps}x{shape.num_workers} starts again against the tasks there are")

    def fail_request(self, request_id: int, shape: Shape, error: str, launch_s: float) -> None:
        with self._lock:
            current = self.group.counts()
            self.records.append(
                RescaleRecord(
                    request_id, current, (shape.num_ps, shape.num_workers), self._step(), 0.0, launch_s, False, error
                )
            )
            self.requests.mark_failed(request_id, Shape(*current, self.group.placement()))
        self._event(f"rescale to {shape.num_ps}x{shape.num_workers} failed: {error}")

    def _switch(
        self,
        request_id: int,
        shape: Shape,
        starting: list[Any],
        ps: list[Any],
        install: Callable[[ShardState | None], None],
    ) -> None:
        """Gather the shards' state if the PS list ``ps`` (slot by slot) re-cuts
        it, then ``install(state)``. A Ray error (a task died) becomes
        :class:`SwitchFailed` with the state gathered and ``starting`` (the
        change's new tasks, pending)."""
        state = None
        try:
            state = self.group.gather_state(self._step()) if self.group.shards_change(ps) else None
            install(state)
        except ray.exceptions.RayError as exc:
            raise SwitchFailed(request_id, shape, starting, state, exc) from exc

    def _apply_change(self, pending: PendingChange) -> None:
        """Switch to the new shape. The pause is the time spent here."""
        self._flush()  # a window measures one shape: the steps before the switch are the old one's
        t0 = time.perf_counter()
        before = self.group.counts()
        slots = [pending.kept_ps.get(i) for i in range(pending.shape.num_ps)]  # None: a new PS
        starting = pending.starting()
        try:
            started = [tasks.to_task(p) for p in starting]
        except ray.exceptions.RayError as exc:  # one died before it ran
            raise SwitchFailed(pending.request_id, pending.shape, starting, None, exc) from exc
        self._switch(
            pending.request_id, pending.shape, starting, slots, lambda state: self.install(pending, started, state)
        )
        pause = time.perf_counter() - t0
        record = RescaleRecord(
            request_id=pending.request_id,
            from_shape=before,
            to_shape=self.group.counts(),
            at_step=self._step(),
            pause_s=pause,
            launch_s=time.monotonic() - pending.launched_at,
            ok=True,
            reason=pending.reason,
            new_tasks=len(started),
        )
        with self._lock:
            self.records.append(record)
            self.requests.mark_applied(pending.request_id)
        self._event(
            f"rescaled {before[0]}x{before[1]} -> {record.to_shape[0]}x{record.to_shape[1]}"
            f" (pause {pause * 1000:.0f} ms)"
        )

    def install(self, pending: PendingChange, started: list[tasks.Task], state: ShardState | None) -> None:
        """Make ``pending.shape`` current with ``started`` (its new PS, then its new workers)."""
        n_ps = len(pending.new_ps)
        self.group.install(
            pending.shape,
            {**pending.kept_ps, **dict(zip(pending.new_ps, started[:n_ps], strict=True))},
            {**pending.kept_workers, **dict(zip(pending.new_workers, started[n_ps:], strict=True))},
            state,
            self._step(),
        )

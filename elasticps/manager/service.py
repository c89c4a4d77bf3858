"""The configuration manager's control loop.

One owner for each part of a job's state:

- the **store** holds what users asked (spec, limits), the job's state (moved
  only through :mod:`elasticps.manager.states`), and what the scheduler wants
  of it (``desired``);
- the **runtime** (a :class:`JobRuntime`) says what the job actually runs: the
  allocation is recorded when a poll shows a shape applied, never when it is
  merely asked for.

API calls are commands: each takes the manager's one lock, writes its durable
effect (a new job, a cancel, new limits) to the store, and wakes the loop;
whatever must happen to running tasks (stopping a cancelled job) is queued
for the loop, which drains the queue. A round holds the same lock, so a
round never sees half a command, and a cancelled job is never started again:
its state in the store is final.

Every round (``step``): poll each running job (new windows become speed
observations, runtime events become stored events, an ended job gets its
final state); refit speed models; read capacity; run the policy and
placement (the same code as the simulator); start admitted jobs and ask
running ones for new shapes. One job's failure to start or rescale is an
event, not the end of the round.

A job the store says is running but that has no handle here (the manager was
killed and restarted) is started again from its latest checkpoint.
"""

from __future__ import annotations

import logging
import shutil
import sqlite3
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from elasticps.errors import ConfigError, ElasticPSError, JobEndedError, ProgramError, UnschedulableError
from elasticps.manager.capacity import capacity_change, capacity_signature
from elasticps.manager.history import ClusterHistory
from elasticps.manager.isolation import FIGURE_ERRORS, decide_isolated, window_problem
from elasticps.manager.metrics import ManagerMetrics, MetricsSnapshot
from elasticps.manager.pinning import CODE_DIR, pin
from elasticps.manager.priors import FleetPriors, kind_of, read_observations
from elasticps.manager.reasons import Move, batch_reason, explain
from elasticps.manager.rescale_costs import RescaleCosts
from elasticps.manager.runtime import CapacitySource, JobHandle, JobRuntime, JobStatus, Launch, ProgramInfo
from elasticps.manager.shipping import ShipPolicy
from elasticps.manager.spec import JobSpec, LimitsPatch, TaskSpec, validate_as
from elasticps.manager.states import ACTIVE, IllegalTransition, JobInUse, JobState
from elasticps.manager.store import JobRecord, Rescale, Retention, Store
from elasticps.manager.waiting import SUBMITTED, Waiting, free_after, why_waiting
from elasticps.manager.workdir import job_dir, migrate_job_dirs
from elasticps.placement import place, spans_on
from elasticps.program import check_program_ref
from elasticps.runtime import JobConfig, JobReport, TaskResources
from elasticps.runtime.output import JobLog
from elasticps.sched import ClusterView, JobView, Observation, PolicyState, Resources, SpeedModel, make_policy
from elasticps.sched.fit import fit_problem
from elasticps.sched.goodput import batch_candidates
from elasticps.sched.objectives import batches_for
from elasticps.sched.policies.base import Policy
from elasticps.sched.types import total_of
from elasticps.sched.view import ShapeLimits, ViewPlan, plan_view

log = logging.getLogger("elasticps.manager")

#: A job fails for good after this many failures in a row (to start, or while it runs) with
#: no step of progress between them; before that it starts again from its latest checkpoint.
MAX_FAILURES = 3
#: Seconds to wait before starting a job again after its n-th failure in a row: n times this.
#: Ray takes up to ~30 s to declare a killed node dead; a start placed on it meanwhile fails.
RESTART_BACKOFF_S = 15.0
#: A job's own output (elasticps.runtime.output.JobLog), in its folder.
OUTPUT_DIR = "output"
#: Rounds between two prunings of old events and observations.
PRUNE_EVERY_ROUNDS = 50


class ClusterGrowth(Protocol):
    """Grows or shrinks the Ray cluster itself (e.g. :class:`elasticps.k8s.KubeRayGrowth`)."""

    def reconcile(
        self,
        policy: Policy,
        jobs: list[JobView],
        ray_cluster: ClusterView,
        state: PolicyState,
        ours_by_node: dict[str, Resources],
        hostnames: dict[str, str],
        current: dict[str, dict[str, str]] | None = None,
        placement: str = "locality",
    ) -> Any: ...


@dataclass
class _Live:
    """A job with a handle here: what was asked of it, and what it last said."""

    handle: JobHandle
    asked: tuple[int, int]
    asked_placement: dict[str, str]
    status: JobStatus | None = None
    last_step: int = -1  # windows up to this step are recorded as observations
    events_seen: int = 0  # runtime events already stored
    applied: tuple[int, int, dict] | None = None  # the allocation last recorded
    compute_share: float | None = None  # of a step, in the latest window (the speed model's prior)
    batch: int | None = None  # the global batch last asked for (None: the program's)
    rescales_seen: int = 0  # rescale records already counted

    @property
    def batch_now(self) -> int | None:
        """The global batch asked for last, else the one it reported (None: not yet known)."""
        return self.batch or (self.status.batch_size if self.status is not None else None) or None


def check_allowed(program: str, allowed: tuple[str, ...] | None) -> None:
    """ProgramError unless ``program``'s module is one of ``allowed`` or inside one of them."""
    if allowed is None:
        return
    module = program.partition(":")[0]
    if not any(module == a or module.startswith(a + ".") for a in allowed):
        raise ProgramError(
            f"program {program!r} is not allowed: this manager runs programs from {', '.join(allowed)} only "
            "(--allow-programs)"
        )


class Manager:
    def __init__(
        self,
        store: Store,
        workdir: str | Path,
        policy: str = "elastic",
        objective: str = "goodput",
        placement: str = "locality",
        clock: Callable[[], float] = time.time,
        report_interval_s: float = 2.0,
        growth: ClusterGrowth | None = None,
        policy_options: dict[str, Any] | None = None,
        runtime: JobRuntime | None = None,
        capacity: CapacitySource | None = None,
        allow_programs: tuple[str, ...] | None = None,
        retention: Retention | None = None,
        max_ended_reports: int = 200,
        ship_roots: tuple[str | Path, ...] | None = None,
    ) -> None:
        if runtime is None or capacity is None:
            from elasticps.manager.ray_runtime import RayCapacity, RayJobRuntime

            runtime = runtime or RayJobRuntime()
            capacity = capacity or RayCapacity()
        self.store = store
        self.priors = FleetPriors(store)
        self.rescale_costs = RescaleCosts()  # what rescales cost here, from the runtime's records
        self.workdir = Path(workdir)
        self.runtime = runtime
        self.capacity = capacity
        # e.g. {"rescale_cost_s": 1.0}: what a rescale costs the elastic policy (see docs/scheduler.md)
        self.policy = make_policy(policy, objective=objective, **(policy_options or {}))
        self.objective = objective
        self.placement_method = placement
        self.clock = clock
        self.report_interval_s = report_interval_s
        self.allow_programs = allow_programs
        self.shipping = ShipPolicy.of(ship_roots, workdir)  # the local paths a runtime_env may ship
        self.retention = retention or Retention()
        self.state = PolicyState()
        self.growth = growth
        self.live: dict[str, _Live] = {}
        self.wake = threading.Event()  # an event worth a round now (submission, finish, limits)
        self.ended: OrderedDict[str, JobReport] = OrderedDict()  # final reports of jobs that ended here
        self._max_ended = max_ended_reports
        self._lock = threading.RLock()  # commands and rounds, one at a time
        self._to_close: list[tuple[str, _Live]] = []  # handles to stop and release, drained by the loop
        self._closing: list[tuple[str, _Live]] = []  # being stopped and released now: their tasks still hold room
        self._failures: dict[str, int] = {}  # failures in a row with no progress, per job
        self._not_before: dict[str, float] = {}  # a job that failed starts again from then on
        self._unfit: dict[str, str] = {}  # the "cannot fit" message last stored per job
        self._admitted: set[str] = set()  # jobs whose code this manager checked it may run (see admissible)
        self.waiting: dict[str, Waiting] = {}  # why each active job without a handle here is not running
        self._start_errors: dict[str, str] = {}  # this round's failed starts
        self._rounds = 0
        # the latest rounds' decisions: (time, {job: (ps, workers)}), for reports and tests
        self.decisions: deque[tuple[float, dict[str, tuple[int, int]]]] = deque(maxlen=1000)
        self.history = ClusterHistory(store)  # nodes over time and the latest rounds' moves (the dashboard)
        self.predicted: dict[str, float] = {}  # the speed model's samples/s at each running job's shape
        self.metrics = ManagerMetrics(self.metrics_snapshot)
        for name in migrate_job_dirs(self.workdir, [r.name for r in store.list_jobs()]):
            log.warning("job %s: its files moved to %s (the workdir's new layout)", name, job_dir(self.workdir, name))

    # -- commands (from the API's threads)
    def submit(self, spec: JobSpec) -> JobRecord:
        """Store a new job; its program is resolved first, outside this process."""
        self.admissible(spec)
        self._check_fits(spec)
        folder = job_dir(self.workdir, spec.name)
        fresh = not folder.exists()  # a folder of its own, or a job of that name already there (refused below)
        try:
            spec, pinned = self._pin(spec)
            info = self.runtime.describe(spec, str(folder / CODE_DIR) if pinned else None)
            with self._lock:
                rec = self.store.add_job(spec, self.clock(), info)
                self.waiting[spec.name] = SUBMITTED
        except BaseException:
            if fresh:
                shutil.rmtree(folder, ignore_errors=True)
            raise
        for line in pinned:
            self.store.add_event(self.clock(), spec.name, "pinned", f"code pinned: {line}")
        self.wake.set()
        return rec

    def _pin(self, spec: JobSpec) -> tuple[JobSpec, list[str]]:
        """The spec with the code it ships pinned in the job's folder (see :mod:`elasticps.manager.pinning`)."""
        if spec.runtime_env is None:
            return spec, []
        env, pinned = pin(spec.runtime_env, job_dir(self.workdir, spec.name) / CODE_DIR)
        return spec.model_copy(update={"runtime_env": env}), pinned

    def _check_fits(self, spec: JobSpec) -> None:
        """UnschedulableError if the cluster, even empty, can never hold the job
        (the simulator's test of its workloads). With a growing cluster
        (``growth``) the nodes may change: the rounds say why it waits instead."""
        if self.growth is not None:
            return
        view = JobView(
            id=spec.name, speed=lambda p, w: 0.0, min_ps=spec.ps.min, max_ps=spec.ps.max,
            min_workers=spec.workers.min, max_workers=spec.workers.max,
            ps_resources=_resources(spec.ps), worker_resources=_resources(spec.workers),
        )  # fmt: skip
        with self._lock:
            cluster = self.capacity.view(self._ours())
        problem = fit_problem(view, cluster)
        if problem is not None:
            raise UnschedulableError(f"job {spec.name!r} can never run on this cluster: {problem}")

    def set_limits(self, name: str, patch: LimitsPatch) -> JobRecord:
        """Change a job's min/max PS and workers; the next round honours them."""
        with self._lock:
            rec = self.store.get_job(name)
            if JobState(rec.state).ended:
                raise IllegalTransition(name, JobState(rec.state), JobState(rec.state))
            update: dict[str, Any] = {}
            for kind in ("ps", "workers"):
                part = getattr(patch, kind)
                if part is not None:
                    cur: TaskSpec = getattr(rec.spec, kind)
                    update[kind] = {**cur.model_dump(), **part.model_dump(exclude_none=True)}
            spec: JobSpec = validate_as(JobSpec, {**rec.spec.model_dump(), **update}, "job spec")
            now = self.clock()
            self.store.update_spec(spec, now)
            self.store.add_event(
                now, name, "limits", f"PS {spec.ps.min}..{spec.ps.max}, workers {spec.workers.min}..{spec.workers.max}"
            )
            rec = self.store.get_job(name)
        self.wake.set()
        return rec

    def cancel(self, name: str) -> JobRecord:
        """Cancel for good (idempotent). The job's tasks stop within a round;
        no later round starts it again, and no late report overwrites it."""
        with self._lock:
            rec = self.store.get_job(name)
            if rec.state == JobState.CANCELLED:
                return rec
            rec = self.store.transition(name, JobState.CANCELLED, self.clock(), f"job {name} cancelled")
            self.waiting.pop(name, None)
            live = self.live.pop(name, None)
            if live is not None:
                self._to_close.append((name, live))
        self.wake.set()
        return rec

    def retry(self, name: str) -> JobRecord:
        """Queue a failed or cancelled job again: a new run that resumes from
        its latest intact checkpoint (refused while its last run still stops)."""
        with self._lock:
            if name in self.live or any(n == name for n, _ in self._to_close + self._closing):
                raise JobInUse(f"job {name!r} is still stopping; retry it again in a moment")
            rec = self.store.transition(
                name, JobState.PENDING, self.clock(), f"job {name} retried: it resumes from its latest checkpoint",
                kind="retry",
            )  # fmt: skip
            self._failures.pop(name, None)
            self._not_before.pop(name, None)
            self.waiting[name] = SUBMITTED
        self.wake.set()
        return rec

    def delete(self, name: str) -> JobRecord:
        """Forget an ended job: its record, history and checkpoints; the name can
        be used again. A job that has not ended must be cancelled first."""
        with self._lock:
            rec = self.store.get_job(name)
            if not JobState(rec.state).ended:
                raise JobInUse(f"job {name!r} is {rec.state}; cancel it before deleting it")
            if name in self.live or any(n == name for n, _ in self._to_close + self._closing):
                raise JobInUse(f"job {name!r} is still stopping; delete it again in a moment")
            rec = self.store.delete_job(name)
            self.priors.forget(name)
            shutil.rmtree(job_dir(self.workdir, name), ignore_errors=True)
            self.store.add_event(self.clock(), None, "deleted", f"job {name} deleted ({rec.state}); its name is free")
            self._failures.pop(name, None)
            self._not_before.pop(name, None)
        return rec

    def shutdown(self) -> None:
        with self._lock:
            closing = list(self.live.items()) + self._to_close
            self.live.clear()
            self._to_close = []
        for _, live in closing:
            live.handle.stop()
        for _, live in closing:
            live.handle.close()

    def admissible(self, spec: JobSpec) -> None:
        """A ProgramError or ConfigError unless this manager may run ``spec``'s
        code now: checked at submit and again before every start (a restart, a
        retry), since the operator may have narrowed what is allowed meanwhile."""
        check_program_ref(spec.program)
        check_allowed(spec.program, self.allow_programs)
        if spec.runtime_env is not None and self.allow_programs is not None:
            raise ProgramError(
                "runtime_env is refused: this manager runs installed programs only (--allow-programs), "
                "and shipped code could replace them"
            )
        self.shipping.check(spec.runtime_env)

    # -- the loop
    def step(self) -> dict[str, tuple[int, int]]:
        """One round. Jobs that ended or were cancelled are released after the
        decision, not before (releasing a job's tasks takes seconds); until then
        their tasks count as ours, so the room they hold is handed out already
        and what is started there waits for it in Ray's queue."""
        with self._lock:
            now = self.clock()
            self._collect(now)
            active = self.store.list_jobs(ACTIVE)
            records = [r for r in active if r.name in self.live or self._may_start(r.name, now)]
            observed: dict[str, list[Observation]] = {}  # this round's reads: each job's read once
            try:
                priors = self.priors.models([(r, self._observations(r.name, observed)) for r in active])
            except FIGURE_ERRORS as exc:  # no fleet prior this round; each job's own view is judged below
                log.warning("fleet priors: %s", exc)
                priors = {}
            ours = self._ours()
            cluster = self.capacity.view(ours)
            self.history.sample(now, cluster, ours)
            room = [n.available for n in cluster.nodes]
            views = []
            for r in records:  # one job's figures that break its view fail that job, not the round
                try:
                    view = self._view(r, now, priors, observed, room)
                except FIGURE_ERRORS as exc:
                    self._fail_on_figures(r.name, now, f"{type(exc).__name__}: {exc}")
                    continue
                if view is not None:
                    views.append(view)
            self._note_unfit(views, cluster, now)
            started = time.perf_counter()
            self._start_errors.clear()
            current = {n: live.asked_placement for n, live in self.live.items()}
            state = self.state

            def decide(of: list[JobView]) -> tuple:
                decision, new_state = self.policy.decide(of, cluster, state)
                placed = place(of, decision, cluster, current, self.placement_method)
                # a running job whose new shape did not fit on the nodes keeps its old one
                return decision, new_state, placed, batches_for(of, placed.shapes, self.objective)

            (decision, self.state, placed, batches), views, culprits = decide_isolated(decide, views)
            for name, why in culprits.items():
                self._fail_on_figures(name, now, why)
            self.decisions.append((now, dict(decision)))
            self.metrics.decision_seconds.observe(time.perf_counter() - started)
            shapes = placed.shapes
            moves = explain(views, decision, shapes, self._unfit, cluster)
            self.history.round(now, moves)
            self.predicted = _predicted(views)
            for rec in records:
                if rec.name in culprits:
                    continue
                shape, placement = shapes.get(rec.name), placed.placement.get(rec.name)
                if shape is not None and placement is not None:
                    self._apply(rec, shape, placement, now, cluster, moves.get(rec.name))
                    if rec.name in batches:
                        view = next(v for v in views if v.id == rec.name)
                        self._apply_batch(
                            rec.name, batches[rec.name], now, partial(batch_reason, view, shape, default=self.objective)
                        )
            self._note_waiting([r for r in active if r.name not in culprits], views, cluster, placed.placement, now)
            if self.growth is not None:
                self._grow(views, cluster, current, now)
            self._rounds += 1
            if self._rounds % PRUNE_EVERY_ROUNDS == 1:
                self.store.prune(self.retention)
        self._drain()
        return decision

    def run(self, interval_s: float, stop: threading.Event, watch_s: float = 1.0, settle_s: float = 3.0) -> None:
        """Decide every ``interval_s``, and at once (within ``watch_s``) when a
        job is submitted or ends, limits change, a node joins or leaves, or
        another tenant takes or frees room.

        The engine accounts for tasks we start or stop a moment after we do
        (over a second when several start on a busy machine), so for
        ``settle_s`` after a round capacity is not compared; then it is
        compared with what it was before the round, and only others' changes
        remain.
        """
        last_round = float("-inf")
        settled_at = float("-inf")
        seen: dict[str, tuple[float, float]] | None = None
        while not stop.is_set():
            due = time.monotonic() - last_round >= interval_s
            woken = self.wake.is_set()
            self.wake.clear()
            try:
                self._drain()
                with self._lock:
                    woken = self._collect(self.clock()) or woken
                    if not (due or woken) and time.monotonic() >= settled_at:
                        ours = self._ours()
                        view = self.capacity.view(ours)
                        self.history.sample(self.clock(), view, ours)
                        now_sig = capacity_signature(view)
                        change = capacity_change(seen, now_sig)
                        seen = now_sig
                        if change:
                            self.store.add_event(self.clock(), None, "capacity", change)
                            woken = True
                if due or woken:
                    last_round = time.monotonic()
                    self.step()
                    settled_at = time.monotonic() + settle_s
            except sqlite3.OperationalError as exc:  # another process holds the database, or the disk is full
                log.warning("scheduling round skipped: the database cannot be written now (%s)", exc)
            except Exception:
                log.exception("scheduling round failed")
            self.wake.wait(watch_s)

    def report(self, name: str) -> JobReport | None:
        """The job's report: live if it runs here, else its last one if it ended while this manager ran."""
        with self._lock:
            live = self.live.get(name)
        if live is not None:
            try:
                return live.handle.report()
            except ElasticPSError:
                return None
        return self.ended.get(name)

    def metrics_snapshot(self) -> MetricsSnapshot:
        """What ``GET /metrics`` reports, read now (see :mod:`elasticps.manager.metrics`)."""
        records = self.store.list_jobs()
        statuses = self.statuses()
        rescales = {name: max(0, len(self.store.allocations(name)) - 1) for name in statuses}
        held = self.held()
        try:
            cluster = self.capacity.view(held)
        except Exception:  # no cluster to read (not connected yet, or gone): no capacity figures
            cluster = None
        return MetricsSnapshot(records, statuses, rescales, held, cluster)

    def output(self, name: str, after: int = 0) -> tuple[str, int, int]:
        """The job's own output from byte ``after`` on: ``(text, next offset, bytes dropped)``."""
        self.store.get_job(name)  # KeyError if there is no such job
        return JobLog(job_dir(self.workdir, name) / OUTPUT_DIR).read(after)

    def held(self) -> dict[str, Resources]:
        """What our jobs hold per node now (see :meth:`_ours`)."""
        with self._lock:
            return self._ours()

    def failures_in_a_row(self, name: str) -> int:
        """How many times the job failed (to start, or while running) since its last step of progress."""
        with self._lock:
            return self._failures.get(name, 0)

    def statuses(self) -> dict[str, JobStatus]:
        """The last poll of every job running here. Without the lock, so that reads
        (``GET /jobs``, the dashboard) never wait for a round that is starting jobs:
        ``dict()`` copies the table in one step under the interpreter's lock (its keys
        are strings), and each status is replaced whole by a poll, never changed in place."""
        live = dict(self.live)
        return {n: j.status for n, j in live.items() if j.status is not None}

    # -- helpers (called with the lock held, except _drain)
    def _apply_batch(self, name: str, batch: int, now: float, why: Callable[[int], str]) -> None:
        live = self.live.get(name)
        if live is None or live.status is None or batch == live.batch_now:
            return
        try:
            live.handle.set_batch_size(batch)
        except JobEndedError:
            return
        except ElasticPSError as exc:
            self.store.add_event(now, name, "error", f"could not set the global batch to {batch}: {exc}")
            return
        live.batch = batch
        self.store.add_event(now, name, "batch", why(batch))

    def _apply(
        self,
        rec: JobRecord,
        shape: tuple[int, int],
        placement: dict[str, str],
        now: float,
        cluster: ClusterView,
        move: Move | None = None,
    ) -> None:
        """Start the job, or ask it for its new shape; the event says why (the
        move's action) and how much room the round saw for our jobs (what the
        decision was made on)."""
        live = self.live.get(rec.name)
        if live is None and not self._still_admissible(rec, now):
            return
        try:
            if live is None:
                self._start(rec, shape, placement, now)
            elif shape != live.asked or placement != live.asked_placement:
                live.handle.rescale(*shape, placement)
                live.asked, live.asked_placement = shape, placement
                self.store.set_desired(rec.name, shape)
                room = f"{cluster.available.cpu:.10g} of {cluster.capacity.cpu:.10g} CPUs"
                why = _why(move, shape)
                self.store.add_event(
                    now,
                    rec.name,
                    "rescale",
                    f"rescale to {shape[0]} PS x {shape[1]} workers{why} (the round saw {room} free for our jobs)",
                )
        except JobEndedError:
            pass  # it ended since this round polled it; the next poll retires it
        except ElasticPSError as exc:  # this job's trouble; the round goes on for the others
            verb = "start" if live is None else f"rescale to {shape[0]}x{shape[1]}"
            log.warning("job %s: could not %s: %s", rec.name, verb, exc)
            self.store.add_event(now, rec.name, "error", f"could not {verb}: {exc}")
            if live is None:
                self._start_errors[rec.name] = str(exc)
                failures = self._count_failure(rec.name)
                if failures >= MAX_FAILURES:
                    self._finish_state(rec.name, JobState.FAILED, now, f"job failed: {failures} starts failed: {exc}")

    def _still_admissible(self, rec: JobRecord, now: float) -> bool:
        """False (and the job failed, saying why) if this manager may no longer run the job's code."""
        try:
            self.admissible(rec.spec)
        except (ProgramError, ConfigError) as exc:
            self._finish_state(rec.name, JobState.FAILED, now, f"job failed: not started again: {exc}")
            return False
        return True

    def _start(self, rec: JobRecord, shape: tuple[int, int], placement: dict[str, str], now: float) -> None:
        spec = rec.spec
        config = JobConfig(
            mode=spec.mode,
            checkpoint_dir=str(job_dir(self.workdir, rec.name) / "checkpoints"),
            checkpoint_every_steps=spec.checkpoint_every_steps,
            report_interval_s=self.report_interval_s,
            ps_resources=_task_resources(spec.ps),
            worker_resources=_task_resources(spec.workers),
        )
        env = spec.runtime_env.to_ray() if spec.runtime_env else None
        output = str(job_dir(self.workdir, rec.name) / OUTPUT_DIR)
        code = str(job_dir(self.workdir, rec.name) / CODE_DIR)
        launch = Launch(rec.name, spec.program, dict(spec.args), config, shape, dict(placement), env, output, code)
        live = _Live(self.runtime.start(launch), shape, dict(placement))
        try:  # a start the store cannot record (its database locked, its disk full) is released
            self.store.set_desired(rec.name, shape)
            with_shape = f"with {shape[0]} PS x {shape[1]} workers"
            if rec.state == JobState.RUNNING:  # running in the store, not here: the manager was restarted
                self.store.add_event(now, rec.name, "started", f"restarted from its latest checkpoint {with_shape}")
            else:
                self.store.transition(rec.name, JobState.RUNNING, now, f"started {with_shape}", kind="started")
        except BaseException:
            self._to_close.append((rec.name, live))
            raise
        self.live[rec.name] = live
        self.waiting.pop(rec.name, None)

    def _collect(self, now: float) -> bool:
        """Poll every job here: record new speed observations, store runtime
        events, record applied allocations, retire jobs that ended (True if one did).

        A job's first measurement at a new shape does not start a round: the
        job measured first would explore first and take the room that others,
        measured a moment later, would have shared (tried in the demo: their
        completion times got worse). Exploration moves at the interval."""
        news = False
        for name, live in list(self.live.items()):
            try:
                st = live.handle.poll(live.last_step, live.events_seen, live.rescales_seen)
            except ProgramError as exc:  # its answer was not plain data: the program's doing, not bad luck
                self._retire(name, live, JobState.FAILED, now, f"job failed: {exc}")
                news = True
                continue
            except ElasticPSError as exc:  # the job's driver is gone: nothing of it runs any more
                self._stopped_by_failure(name, live, now, str(exc))
                news = True
                continue
            live.status = st
            bad = next((p for p in map(window_problem, st.windows) if p), None)
            if bad is not None:
                self._retire(name, live, JobState.FAILED, now, f"job failed: {bad}")
                news = True
                continue
            for w, end in zip(st.windows, _window_ends(st.windows, now), strict=True):
                if w.last_step > live.last_step:
                    self.store.record_observation(
                        name, end, w.num_ps, w.num_workers, w.samples_per_s, w.batch_size, w.nodes, w.cross,
                        step=w.last_step, epoch=st.epoch, loss=w.loss, metric=st.metric,
                    )  # fmt: skip
                    live.last_step = w.last_step
                    t = w.mean_step_times
                    total = t.compute_s + t.pull_s + t.push_s + t.update_s + t.wait_s
                    if total > 0:
                        live.compute_share = t.compute_s / total
                    self._failures.pop(name, None)  # progress: its earlier failures are behind it
            for text in st.events:
                self.store.add_event(now, name, _event_kind(text), text)
                if text.partition(": ")[2].startswith("rescale to") and "failed" in text:
                    live.asked, live.asked_placement = (st.num_ps, st.num_workers), dict(st.placement)
            live.events_seen = st.events_total
            if st.windows or st.ended:
                self._keep_progress(name, st)
            for rec in st.rescales:
                self.store.record_rescale(
                    name, now,
                    Rescale(now, rec.at_step, rec.from_shape, rec.to_shape, rec.pause_s, rec.tasks_start_s, rec.ok),
                )  # fmt: skip
                if rec.ok:
                    self.metrics.rescale_pause_seconds.observe(rec.pause_s)
                    if rec.tasks_start_s is not None:
                        self.metrics.rescale_launch_seconds.observe(rec.tasks_start_s)
                self.rescale_costs.observe(name, rec)
            live.rescales_seen = st.rescales_total
            applied = (st.num_ps, st.num_workers, st.placement)
            if st.state == "running" and st.num_ps and applied != live.applied:
                self.store.record_allocation(name, now, *applied)
                live.applied = applied
            elif st.ended and st.num_ps and live.applied is None and st.windows:
                # it ran and ended between two polls: its shape from when its first window began
                self.store.record_allocation(name, _window_ends(st.windows, now)[0] - st.windows[0].elapsed_s, *applied)
                live.applied = applied
            if st.ended:
                if st.state == "finished":
                    metric = f", metric {st.metric:.6g}" if st.metric is not None else ""
                    self._retire(name, live, JobState.FINISHED, now, f"job finished at step {st.step}{metric}")
                elif st.state == "failed" and st.fatal:  # its own error before a step: again would fail again
                    self._retire(name, live, JobState.FAILED, now, f"job failed before its first step: {st.error}")
                elif st.state == "failed":
                    self._stopped_by_failure(name, live, now, st.error or "unknown error")
                else:  # stopped without being cancelled: start it again from its checkpoint
                    self.live.pop(name)
                    self._to_close.append((name, live))
                news = True  # its room is free
        return news

    def _keep_progress(self, name: str, st: JobStatus) -> None:
        """Store the job's latest progress, so it is shown after it ended and after a restart."""
        last = st.windows[-1] if st.windows else None
        kept = self.store.progress(name) or {}
        self.store.set_progress(
            name,
            {
                "step": st.step,
                "epoch": st.epoch,
                "samples_per_s": last.samples_per_s if last else kept.get("samples_per_s"),
                "loss": last.loss if last else kept.get("loss"),
                "metric": st.metric if st.metric is not None else kept.get("metric"),
                "remaining_samples": st.remaining_samples,
            },
        )

    def _stopped_by_failure(self, name: str, live: _Live, now: float, why: str) -> None:
        """A running job failed (its driver died, a task could not be placed on a
        node that just left, ...): start it again from its latest checkpoint at
        the next round, unless it has failed MAX_FAILURES times in a row without
        progress or its program itself is at fault."""
        failures = self._count_failure(name)
        if failures >= MAX_FAILURES or why.startswith(ProgramError.__name__):
            self._retire(name, live, JobState.FAILED, now, f"job failed: {why}")
            return
        self.live.pop(name, None)
        self._to_close.append((name, live))
        wait_s = RESTART_BACKOFF_S * failures
        self._not_before[name] = now + wait_s
        again = f"it starts again from its latest checkpoint in {wait_s:g} s ({failures}/{MAX_FAILURES})"
        self.store.add_event(now, name, "error", f"job stopped: {why}; {again}")

    def _fail_on_figures(self, name: str, now: float, why: str) -> None:
        """Fail a job whose figures the scheduler cannot work with (the round goes on without it)."""
        log.warning("job %s: its figures broke the scheduler: %s", name, why)
        message = f"job failed: its figures broke the scheduler ({why})"
        live = self.live.get(name)
        if live is not None:
            self._retire(name, live, JobState.FAILED, now, message)
        else:
            self._finish_state(name, JobState.FAILED, now, message)

    def _count_failure(self, name: str) -> int:
        """One more failure of ``name`` (to start, or while running) since its last progress; how many now."""
        self._failures[name] = self._failures.get(name, 0) + 1
        return self._failures[name]

    def _may_start(self, name: str, now: float) -> bool:
        return self._not_before.get(name, float("-inf")) <= now

    def _retire(self, name: str, live: _Live, state: JobState, now: float, message: str) -> None:
        self.live.pop(name, None)
        self._to_close.append((name, live))
        self._finish_state(name, state, now, message)

    def _finish_state(self, name: str, state: JobState, now: float, message: str) -> None:
        self.rescale_costs.forget(name)
        self.waiting.pop(name, None)
        try:
            self.store.transition(name, state, now, message)
        except IllegalTransition as exc:  # e.g. cancelled meanwhile: the cancel stands
            log.info("%s", exc)

    def _drain(self) -> None:
        """Stop and release the handles queued by commands and retirements
        (outside the lock: releasing tasks takes a while)."""
        with self._lock:
            closing, self._to_close = self._to_close, []
            self._closing += closing
        for name, live in closing:
            live.handle.stop()
            try:
                self.ended[name] = live.handle.report()
                while len(self.ended) > self._max_ended:
                    self.ended.popitem(last=False)
            except ElasticPSError:
                pass  # its driver is gone with its report
            live.handle.close()
            with self._lock:
                self._closing = [(n, x) for n, x in self._closing if x is not live]

    def _grow(self, views: list[JobView], cluster: ClusterView, current: dict, now: float) -> None:
        """Ask for more Ray nodes (or fewer) when the jobs could use them."""
        assert self.growth is not None
        try:
            plan = self.growth.reconcile(
                self.policy, views, cluster, self.state, self._ours(), self.capacity.hostnames(), current,
                self.placement_method,
            )  # fmt: skip
        except Exception as exc:  # the jobs keep running on the nodes there are
            log.warning("resizing the Ray cluster failed: %s", exc)
            self.store.add_event(now, None, "growth", f"could not resize the Ray cluster: {exc}")
            return
        if plan is not None:
            gone = f"; removing {', '.join(plan.workers_to_delete)}" if plan.workers_to_delete else ""
            self.store.add_event(now, None, "growth", f"Ray worker pods -> {plan.replicas} ({plan.reason}){gone}")

    def _note_unfit(self, views: list[JobView], cluster: ClusterView, now: float) -> None:
        """Store once why a waiting job can never run here (and again if the reason changes)."""
        for view in views:
            if view.current is not None:
                continue
            problem = fit_problem(view, cluster)
            if problem and self._unfit.get(view.id) != problem:
                self.store.add_event(now, view.id, "unfit", problem)
            if problem:
                self._unfit[view.id] = problem
            else:
                self._unfit.pop(view.id, None)

    def _note_waiting(
        self, active: list[JobRecord], views: list[JobView], cluster: ClusterView, placed: dict, now: float
    ) -> None:
        """Say why each active job without a handle here is not running (see :mod:`.waiting`)."""
        by_id = {v.id: v for v in views}
        free = free_after(cluster, placed, by_id)
        for rec in active:
            if rec.name in self.live:
                continue
            view = by_id.get(rec.name)
            if not self._may_start(rec.name, now):
                failures = self._failures.get(rec.name, 0)
                wait_s = self._not_before[rec.name] - now
                why = Waiting(f"starts again from its latest checkpoint in {wait_s:.0f} s ({failures}/{MAX_FAILURES})")
            elif rec.name in self._start_errors:
                why = Waiting(f"could not start: {self._start_errors[rec.name]}")
            elif view is not None:
                why = why_waiting(view, cluster, free, len(placed))
            else:
                continue
            self.waiting[rec.name] = why

    def _info(self, rec: JobRecord, now: float) -> ProgramInfo | None:
        if rec.info is not None:
            return rec.info
        try:  # a job stored by an older version, before programs were described at submission
            info = self.runtime.describe(rec.spec, str(job_dir(self.workdir, rec.name) / CODE_DIR))
        except ElasticPSError as exc:
            self._finish_state(rec.name, JobState.FAILED, now, f"job failed: {exc}")
            return None
        self.store.set_info(rec.name, info)
        return info

    def _observations(self, name: str, observed: dict[str, list[Observation]]) -> list[Observation]:
        """A job's stored speed observations, read once per round: ``observed`` holds the round's reads."""
        if name not in observed:
            observed[name] = read_observations(self.store, name)
        return observed[name]

    def _view(
        self,
        rec: JobRecord,
        now: float,
        priors: dict[tuple, SpeedModel],
        observed: dict[str, list[Observation]],
        room: list[Resources],
    ) -> JobView | None:
        """What the policy knows of a job; its speeds are predicted for the
        nodes each shape would span on the ``room`` the nodes have for our jobs."""
        live = self.live.get(rec.name)
        if live is None and rec.name not in self._admitted:  # once per job here; again before each start
            if not self._still_admissible(rec, now):
                return None
            self._admitted.add(rec.name)
        info = self._info(rec, now)
        if info is None:
            return None
        spec = rec.spec
        share = live.compute_share if live is not None else None
        ps_res, worker_res = _resources(spec.ps), _resources(spec.workers)
        span = spans_on(ps_res, worker_res, room)
        model = SpeedModel(info.batch_size, spec.mode, span=span, compute_share=share)
        model.fit(self._observations(rec.name, observed))
        current = None
        remaining = float(info.epochs * info.samples_per_epoch)
        if live is not None:
            current = live.asked  # asked for; the job switches at its next step boundary
            if live.status is not None and live.status.remaining_samples is not None:
                remaining = float(max(1, live.status.remaining_samples))
        limits = ShapeLimits(spec.ps.min, spec.ps.max, spec.workers.min, spec.workers.max)
        if live is not None and (live.status is None or (live.status.num_ps, live.status.num_workers) != live.asked):
            # starting, or a rescale in flight: judged again once the runtime reports it applied (or failed)
            (p, w) = live.asked
            plan = ViewPlan(model.predict, ShapeLimits(p, p, w, w))
        else:
            prior = priors.get(kind_of(rec))
            prior = prior.with_span(span) if prior is not None else None
            plan = plan_view(model, limits, current, prior=prior)  # the simulator's rule too
        cost = self.rescale_costs.of(rec.name)
        return JobView(
            id=rec.name,
            speed=plan.speed,
            min_ps=plan.limits.min_ps,
            max_ps=plan.limits.max_ps,
            min_workers=plan.limits.min_workers,
            max_workers=plan.limits.max_workers,
            ps_resources=ps_res,
            worker_resources=worker_res,
            remaining_samples=remaining,
            current=current,
            objective=spec.objective,
            arrival=rec.submitted_at,
            waited_s=now - rec.submitted_at if live is None else 0.0,
            explore=plan.explore,
            probes=plan.probes,
            batch_sizes=_batch_sizes(spec, info) if plan.speed_at is not None else (),  # none while switching
            batch=live.batch_now if live is not None else None,
            noise_scale=live.status.noise_scale if live is not None and live.status is not None else None,
            speed_at=plan.speed_at,
            speed_sd=plan.sd,
            rescale_pause_s=cost.pause_s if cost is not None else None,
            rescale_launch_s=cost.launch_s if cost is not None else 0.0,
        )

    def _ours(self) -> dict[str, Resources]:
        """What our jobs hold per node: what was asked, what they still hold while
        they switch, and what ended or cancelled jobs hold until they are released."""
        per_node: dict[str, list[Resources]] = {}
        for name, live in [*self.live.items(), *self._to_close, *self._closing]:
            try:
                spec = self.store.get_job(name).spec
            except KeyError:
                continue
            held = dict(live.status.held) if live.status is not None else {}
            for task, node in held.items() | live.asked_placement.items():
                kind = spec.ps if task.startswith("ps-") else spec.workers
                per_node.setdefault(node, []).append(_resources(kind))
        return {n: total_of(rs) for n, rs in per_node.items()}


def _predicted(views: list[JobView]) -> dict[str, float]:
    """The speed model's samples/s for each running job at its shape (what its ETA is read from)."""
    out = {}
    for v in views:
        if v.current is not None:
            try:
                out[v.id] = float(v.speed(*v.current))
            except FIGURE_ERRORS:
                continue
    return out


def _window_ends(windows: list, now: float) -> list[float]:
    """When each window of one poll ended, about: the last one now, each earlier
    one as long before as the later ones lasted (a poll may bring several)."""
    ends, t = [], now
    for w in reversed(windows):
        ends.append(t)
        t -= w.elapsed_s
    return ends[::-1]


def _why(move: Move | None, shape: tuple[int, int]) -> str:
    """``": grow"``, ``": shrink for job b"``, ... for a rescale event ("" if the round did not say)."""
    if move is None or move.shape != shape or move.action in ("keep", "admit", "wait", "unfit"):
        return ""
    return f": {move.why}"


def _event_kind(text: str) -> str:
    """The stored kind of a runtime event: task and node losses stand out."""
    if "died" in text or "is gone" in text:
        return "loss"
    if "checkpoint" in text and "damaged" in text:
        return "checkpoint"
    return "runtime"


def _resources(task: TaskSpec) -> Resources:
    """What one task of this kind takes, as the policy and placement count it."""
    return Resources(cpu=task.cpu, gpu=task.gpu, memory_gb=task.memory_gb)


def _task_resources(task: TaskSpec) -> TaskResources:
    return TaskResources(
        cpu=task.cpu, gpu=task.gpu, memory_bytes=int(task.memory_gb * 1024**3), cpu_limit=task.cpu_limit
    )


def _batch_sizes(spec: JobSpec, info: ProgramInfo) -> tuple[int, ...]:
    """The global batches the scheduler may choose for a job (none: it is fixed)."""
    return batch_candidates(info.batch_size, info.max_batch_size) if spec.mode == "sync" else ()

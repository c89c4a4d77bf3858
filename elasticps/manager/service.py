"""The configuration manager: the facade the API, the CLI and the tests use.

A :class:`Manager` takes commands (:mod:`elasticps.manager.commands`), runs
scheduling rounds, and answers reads (reports, metrics, output). What each
part of a job's state has for its owner is in :mod:`elasticps.manager.live`.

API calls are commands under the manager's one lock; a round holds the same
lock, so a round never sees half a command (see :mod:`elasticps.manager.commands`).
Every round (``step``): poll each running job (:mod:`elasticps.manager.observe`);
read capacity; build what the policy knows of each job
(:mod:`elasticps.manager.job_views`); run the policy and placement (the same
code as the simulator); start admitted jobs and ask running ones for new
shapes (:mod:`elasticps.manager.apply`). One job's failure to start or
rescale is an event, not the end of the round; nor is one job's figures
breaking the policy (:mod:`elasticps.manager.isolation`).

A job the store says is running but that has no handle here (the manager was
killed and restarted) is started again from its latest checkpoint.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from elasticps.errors import ElasticPSError, failure_text
from elasticps.manager.admission import Admission
from elasticps.manager.apply import Applier
from elasticps.manager.capacity import capacity_change, capacity_signature
from elasticps.manager.commands import Commands
from elasticps.manager.history import ClusterHistory
from elasticps.manager.isolation import decide_isolated
from elasticps.manager.job_views import ViewBuilder, predicted
from elasticps.manager.live import JobTable
from elasticps.manager.metrics import ManagerMetrics, MetricsSnapshot
from elasticps.manager.observe import Observer
from elasticps.manager.priors import FleetPriors
from elasticps.manager.reasons import batch_reason, explain
from elasticps.manager.rescale_costs import RescaleCosts
from elasticps.manager.runtime import CapacitySource, JobRuntime, JobStatus
from elasticps.manager.shipping import ShipPolicy
from elasticps.manager.spec import JobSpec, LimitsPatch
from elasticps.manager.states import ACTIVE
from elasticps.manager.store import JobRecord, Retention, Store
from elasticps.manager.workdir import OUTPUT_DIR, job_dir, migrate_job_dirs
from elasticps.placement import place
from elasticps.runtime import JobReport
from elasticps.runtime.output import JobLog
from elasticps.sched import ClusterView, JobView, PolicyState, Resources, make_policy
from elasticps.sched.objectives import batches_for
from elasticps.sched.policies.base import Policy
from elasticps.sched.rounds import admission_only, state_after

log = logging.getLogger("elasticps.manager")

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


class Manager:
    """The facade over the manager's parts: commands go to :class:`Commands`, a
    round (:meth:`step`) runs :class:`Observer`, :class:`ViewBuilder`, the policy
    and placement, then :class:`Applier`; reads come from the store and the
    :class:`JobTable`. Each part is built here from what it needs and nothing more."""

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
        # absolute: a job's tasks run where Ray puts them (in its copy of a shipped working_dir), and the
        # checkpoint, output and code paths they are handed must still name this workdir
        self.workdir = Path(workdir).resolve()
        self.runtime = runtime
        self.capacity = capacity
        # e.g. {"rescale_cost_s": 1.0}: what a rescale costs the elastic policy (see docs/scheduler.md)
        self.policy = make_policy(policy, objective=objective, **(policy_options or {}))
        self.objective = objective
        self.placement_method = placement
        self.clock = clock
        self.retention = retention or Retention()
        self.state = PolicyState()
        self.growth = growth
        self._growth_failing: str | None = None  # why resizing the Ray cluster fails, while it does
        self.wake = threading.Event()  # an event worth a round now (submission, finish, limits)
        self.reshape = threading.Event()  # and one that only a full round answers (limits)
        self._lock = threading.RLock()  # commands and rounds, one at a time
        self.jobs = JobTable(store, self.rescale_costs, self.priors, max_ended_reports)
        self.live = self.jobs.live  # the jobs with a handle here
        self.waiting = self.jobs.waiting  # why each active job without a handle here is not running
        self.ended = self.jobs.ended  # final reports of jobs that ended here
        self._rounds = 0
        # the latest rounds' decisions: (time, {job: (ps, workers)}), for reports and tests
        self.decisions: deque[tuple[float, dict[str, tuple[int, int]]]] = deque(maxlen=1000)
        self.history = ClusterHistory(store)  # nodes over time and the latest rounds' moves (the dashboard)
        self.predicted: dict[str, float] = {}  # the speed model's samples/s at each running job's shape
        self.metrics = ManagerMetrics(self.metrics_snapshot)
        self.admission = Admission(allow_programs, ShipPolicy.of(ship_roots, self.workdir), self.jobs)
        self.commands = Commands(
            store=store, jobs=self.jobs, lock=self._lock, wake=self.wake, clock=clock, workdir=self.workdir,
            runtime=runtime, capacity=capacity, admission=self.admission, reshape=self.reshape,
        )  # fmt: skip
        self.observer = Observer(store, self.jobs, self.metrics, self.rescale_costs)
        self.views = ViewBuilder(
            store, runtime, self.workdir, self.jobs, self.admission, self.priors, self.rescale_costs
        )
        self.applier = Applier(store, runtime, self.workdir, self.jobs, self.admission, report_interval_s)
        for name in migrate_job_dirs(self.workdir, [r.name for r in store.list_jobs()]):
            log.warning("job %s: its files moved to %s (the workdir's new layout)", name, job_dir(self.workdir, name))

    # -- commands (from the API's threads; see elasticps.manager.commands)
    def submit(self, spec: JobSpec) -> JobRecord:
        """Store a new job; its program is resolved first, outside this process."""
        return self.commands.submit(spec, nodes_fixed=self.growth is None)

    def set_limits(self, name: str, patch: LimitsPatch) -> JobRecord:
        """Change a job's min/max PS and workers; the next round honours them."""
        return self.commands.set_limits(name, patch, nodes_fixed=self.growth is None)

    def cancel(self, name: str) -> JobRecord:
        """Cancel for good (idempotent). The job's tasks stop within a round;
        no later round starts it again, and no late report overwrites it."""
        return self.commands.cancel(name)

    def retry(self, name: str) -> JobRecord:
        """Queue a failed or cancelled job again: a new run that resumes from
        its latest intact checkpoint (refused while its last run still stops)."""
        return self.commands.retry(name)

    def delete(self, name: str) -> JobRecord:
        """Forget an ended job: its record, history and checkpoints; the name can
        be used again. A job that has not ended must be cancelled first."""
        return self.commands.delete(name)

    def shutdown(self) -> None:
        """Stop and release every job's tasks here; the store keeps their states,
        so a manager started again restarts them from their latest checkpoints."""
        with self._lock:
            closing = self.jobs.take_all()
        for live in closing:
            live.handle.stop()
        for live in closing:
            live.handle.close()

    # -- the loop
    def step(self, full: bool = True) -> dict[str, tuple[int, int]]:
        """One round: a full one, or (``full=False``) one that only starts waiting
        jobs in free room, running jobs held at their shapes
        (:mod:`elasticps.sched.rounds`). Jobs that ended or were cancelled are
        released after the decision, not before (releasing a job's tasks takes
        seconds); until then their tasks count as ours, so the room they hold is
        handed out already and what is started there waits for it in Ray's queue."""
        with self._lock:
            now = self.clock()
            self.observer.collect(now)
            active = self.store.list_jobs(ACTIVE)
            records = [r for r in active if r.name in self.live or self.jobs.may_start(r.name, now)]
            reads = self.views.read(active)  # each job's observations read once this round
            ours = self.jobs.held()
            cluster = self.capacity.view(ours)
            self.history.sample(now, cluster, ours)
            views = self.views.views(records, reads, cluster, now)
            self.applier.note_unfit(views, cluster, now)
            started = time.perf_counter()
            self.applier.new_round()
            current = {n: live.asked_placement for n, live in self.live.items()}
            state = self.state

            def decide(of: list[JobView]) -> tuple:
                decision, new_state = self.policy.decide(of if full else admission_only(of), cluster, state)
                placed = place(of, decision, cluster, current, self.placement_method)
                # a running job whose new shape did not fit on the nodes keeps its old one
                return decision, new_state, placed, batches_for(of, placed.shapes, self.objective)

            (decision, new_state, placed, batches), views, culprits = decide_isolated(decide, views)
            self.state = state_after(self.state, new_state, full)
            for name, why in culprits.items():
                self.jobs.fail_on_figures(name, now, why)
            self.decisions.append((now, dict(decision)))
            self.metrics.decision_seconds.observe(time.perf_counter() - started)
            shapes = placed.shapes
            moves = explain(views, decision, shapes, self.jobs.unfit, cluster)
            self.history.round(now, moves)
            self.predicted = predicted(views)
            for rec in records:
                if rec.name in culprits:
                    continue
                shape, placement = shapes.get(rec.name), placed.placement.get(rec.name)
                if shape is not None and placement is not None:
                    self.applier.apply(rec, shape, placement, now, cluster, moves.get(rec.name))
                    if rec.name in batches:
                        view = next(v for v in views if v.id == rec.name)
                        why = partial(batch_reason, view, shape, default=self.objective)
                        self.applier.apply_batch(rec.name, batches[rec.name], now, why)
            self.applier.note_waiting(
                [r for r in active if r.name not in culprits], views, cluster, placed.placement, now
            )
            if self.growth is not None:
                self._grow(views, cluster, current, now)
            self._rounds += 1
            if self._rounds % PRUNE_EVERY_ROUNDS == 1:
                self.store.prune(self.retention)
        self.drain()
        return decision

    def run(self, interval_s: float, stop: threading.Event, watch_s: float = 1.0, settle_s: float = 3.0) -> None:
        """A full round every ``interval_s`` and at once (within ``watch_s``) when
        limits change, a node joins or leaves, or another tenant takes or frees
        room; when a job is submitted, cancelled or retried, or ends, at once a
        round that only starts waiting jobs (:mod:`elasticps.sched.rounds`).

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
            reshape = False
            try:
                self.drain()
                with self._lock:
                    reshape = self.reshape.is_set()  # set under this lock: read and cleared with it
                    self.reshape.clear()
                    woken = self.observer.collect(self.clock()) or woken or reshape
                    if not (due or woken) and time.monotonic() >= settled_at:
                        ours = self.jobs.held()
                        view = self.capacity.view(ours)
                        self.history.sample(self.clock(), view, ours)
                        now_sig = capacity_signature(view)
                        change = capacity_change(seen, now_sig)
                        seen = now_sig
                        if change:
                            self.store.add_event(self.clock(), None, "capacity", change)
                            woken = reshape = True
                if due or woken:
                    if due or reshape:  # the interval runs from the last full round
                        last_round = time.monotonic()
                    self.step(full=due or reshape)
                    reshape = False
                    settled_at = time.monotonic() + settle_s
            except sqlite3.OperationalError as exc:  # another process holds the database, or the disk is full
                log.warning("scheduling round skipped: the database cannot be written now (%s)", exc)
            except Exception:
                log.exception("scheduling round failed")
            if reshape:  # new limits or capacity whose full round failed: the next pass tries it again
                self.reshape.set()
                self.wake.set()
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
        """What our jobs hold per node now (see :meth:`JobTable.held`)."""
        with self._lock:
            return self.jobs.held()

    def failures_in_a_row(self, name: str) -> int:
        """How many times the job failed (to start, or while running) since its last step of progress."""
        with self._lock:
            return self.jobs.failures_of(name)

    def statuses(self) -> dict[str, JobStatus]:
        """The last poll of every job running here. Without the lock, so that reads
        (``GET /jobs``, the dashboard) never wait for a round that is starting jobs:
        ``dict()`` copies the table in one step under the interpreter's lock (its keys
        are strings), and each status is replaced whole by a poll, never changed in place."""
        live = dict(self.live)
        return {n: j.status for n, j in live.items() if j.status is not None}

    def drain(self) -> None:
        """Stop and release the handles queued by commands and retirements (the
        loop does so before and after each round). Call it without the lock held:
        stopping tasks takes a while, and it takes the lock for its bookkeeping."""
        self.jobs.drain(self._lock)

    # -- the round's parts (called with the lock held)

    def _grow(self, views: list[JobView], cluster: ClusterView, current: dict, now: float) -> None:
        """Ask for more Ray nodes (or fewer) when the jobs could use them."""
        assert self.growth is not None
        try:
            plan = self.growth.reconcile(
                self.policy, views, cluster, self.state, self.jobs.held(), self.capacity.hostnames(), current,
                self.placement_method,
            )  # fmt: skip
        except Exception as exc:  # the jobs keep running on the nodes there are
            why = failure_text(exc)
            if why != self._growth_failing:  # said once while it fails the same way, not every round
                log.warning("resizing the Ray cluster failed: %s", why)
                self.store.add_event(now, None, "growth", f"could not resize the Ray cluster: {why}")
            self._growth_failing = why
            return
        if self._growth_failing is not None:
            self._growth_failing = None
            self.store.add_event(now, None, "growth", "the Ray cluster can be resized again")
        if plan is not None:
            gone = f"; removing {', '.join(plan.workers_to_delete)}" if plan.workers_to_delete else ""
            self.store.add_event(now, None, "growth", f"Ray worker pods -> {plan.replicas} ({plan.reason}){gone}")

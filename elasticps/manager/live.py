"""The jobs this manager runs, as it holds them in memory beside the store.

One owner for each part of a job's state:

- the **store** holds what users asked (spec, limits), the job's state (moved
  only through :mod:`elasticps.manager.states`), and what the scheduler wants
  of it (``desired``);
- the **runtime** (a :class:`JobRuntime`) says what the job actually runs: the
  allocation is recorded when a poll shows a shape applied, never when it is
  merely asked for (:mod:`elasticps.manager.observe`);
- the :class:`JobTable` here holds what only this process knows: the handle of
  each job running here, the handles still to stop and release, the failures
  in a row of each job and when it may start again, why each waiting job
  waits (and why it can never fit), and which jobs' code was checked here.

A job enters the table when it is submitted or retried
(:meth:`JobTable.submitted`, :meth:`JobTable.retried`: it waits) and when it
starts (:meth:`JobTable.started`: it has a handle). It leaves it in one of
these ways, each here: it is released to start again later
(:meth:`JobTable.release`), it is cancelled (:meth:`JobTable.cancelled`), it
ends for good (:meth:`JobTable.retire`, :meth:`JobTable.finish`: the store's
state final), or it failed and starts again after a backoff unless it failed
too often (:meth:`JobTable.stopped_by_failure`). A deleted job's name is
cleared in one place (:meth:`JobTable.forget`), and a shutdown takes every
handle (:meth:`JobTable.take_all`).
Everything here is called with the manager's lock held, except the slow part
of :meth:`JobTable.drain` (stopping tasks), which takes the lock itself for
its bookkeeping.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from elasticps.errors import ElasticPSError, ProgramError
from elasticps.manager.priors import FleetPriors
from elasticps.manager.rescale_costs import RescaleCosts
from elasticps.manager.runtime import JobHandle, JobStatus
from elasticps.manager.states import IllegalTransition, JobState
from elasticps.manager.store import Store
from elasticps.manager.task_resources import policy_resources
from elasticps.manager.waiting import SUBMITTED, Waiting
from elasticps.runtime import JobReport
from elasticps.sched import Resources
from elasticps.sched.types import total_of

log = logging.getLogger("elasticps.manager")

#: A job fails for good after this many failures in a row (to start, or while it runs) with
#: no step of progress between them; before that it starts again from its latest checkpoint.
MAX_FAILURES = 3
#: How the event of a run stopped by a failure (to start again) begins: where a run ended (the dashboard's shapes).
STOPPED = "job stopped: "
#: Seconds to wait before starting a job again after its n-th failure in a row: n times this.
#: Ray takes up to ~30 s to declare a killed node dead; a start placed on it meanwhile fails.
RESTART_BACKOFF_S = 15.0


@dataclass
class LiveJob:
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


class JobTable:
    """The manager's in-memory book of its jobs: what only this process knows of
    each (see the module's docstring). Other parts read ``live``, ``waiting`` and
    ``ended``; every change goes through a method here, so that a job enters and
    leaves the table in the ways named above, and :meth:`forget` is the one place
    a deleted job's name is cleared."""

    def __init__(
        self, store: Store, rescale_costs: RescaleCosts, priors: FleetPriors, max_ended_reports: int = 200
    ) -> None:
        self.store = store
        self.rescale_costs = rescale_costs  # a job's are forgotten when it ends
        self.priors = priors  # an ended job's observations count for its kind until it is deleted
        self.live: dict[str, LiveJob] = {}  # the jobs with a handle here
        self.waiting: dict[str, Waiting] = {}  # why each active job without a handle here is not running
        self.ended: OrderedDict[str, JobReport] = OrderedDict()  # final reports of jobs that ended here
        self._to_close: list[tuple[str, LiveJob]] = []  # handles to stop and release, drained by the loop
        self._closing: list[tuple[str, LiveJob]] = []  # being stopped and released now: their tasks still hold room
        self._failures: dict[str, int] = {}  # failures in a row with no progress, per job
        self._furthest: dict[str, int] = {}  # the furthest step a run of the job reached, per job
        self._not_before: dict[str, float] = {}  # a job that failed starts again from then on
        self._unfit: dict[str, str] = {}  # the "cannot fit" message last stored per job
        self._admitted: set[str] = set()  # jobs whose code this manager checked it may run
        self._max_ended = max_ended_reports

    # -- entering
    def submitted(self, name: str) -> None:
        """A new job: it waits for the next round."""
        self.waiting[name] = SUBMITTED

    def retried(self, name: str) -> None:
        """A new run of an ended job: it starts clean (see :meth:`_run_over`) and waits for the next round."""
        self._run_over(name)
        self.submitted(name)

    def started(self, name: str, live: LiveJob) -> None:
        """The job runs here now, with this handle."""
        self.live[name] = live
        self.waiting.pop(name, None)

    def waits(self, name: str, why: Waiting) -> None:
        """Why an active job without a handle here is not running (this round's reason)."""
        self.waiting[name] = why

    # -- handles
    def in_use(self, name: str) -> bool:
        """Whether the job has a handle here (it runs), or one still being stopped and released."""
        return name in self.live or any(n == name for n, _ in self._to_close + self._closing)

    def release(self, name: str, live: LiveJob) -> None:
        """Drop the job's handle here; the loop stops its tasks and releases them."""
        self.live.pop(name, None)
        self._to_close.append((name, live))

    def cancelled(self, name: str) -> None:
        """The job was cancelled (its state in the store is final): its handle, if
        any, is released, and its run is over here, as at any end (:meth:`_run_over`)."""
        self._run_over(name)
        live = self.live.get(name)
        if live is not None:
            self.release(name, live)

    def retire(self, name: str, live: LiveJob, state: JobState, now: float, message: str) -> None:
        """Release the job's handle and give it its final state."""
        self.release(name, live)
        self.finish(name, state, now, message)

    def finish(self, name: str, state: JobState, now: float, message: str) -> None:
        """Give a job with no handle here its final state (a cancel meanwhile stands)."""
        self._run_over(name)
        try:
            self.store.transition(name, state, now, message)
        except IllegalTransition as exc:  # e.g. cancelled meanwhile: the cancel stands
            log.info("%s", exc)

    def _run_over(self, name: str) -> None:
        """A run of the job ended (finished, failed, cancelled): what it left here is
        no part of a next run (a retry): its own rescale costs, its failures in a
        row and backoff, why it waited, and why it could not fit (a retry that
        cannot fit says so again)."""
        self.rescale_costs.forget(name)
        self.waiting.pop(name, None)
        self._failures.pop(name, None)
        self._furthest.pop(name, None)
        self._not_before.pop(name, None)
        self._unfit.pop(name, None)

    def take_all(self) -> list[LiveJob]:
        """Every handle here and every one queued to close, taken out of the table (the manager shuts down)."""
        taken = [*self.live.values(), *(live for _, live in self._to_close)]
        self.live.clear()
        self._to_close.clear()
        return taken

    def drain(self, lock: threading.RLock) -> None:
        """Stop and release the handles queued by commands and retirements
        (outside the lock: releasing tasks takes a while). The final report is
        kept under the lock: a delete forgets a name's report from an API thread."""
        with lock:
            closing, self._to_close = self._to_close, []
            self._closing += closing
        for name, live in closing:
            live.handle.stop()
            try:
                report = live.handle.report()
            except ElasticPSError:
                pass  # its driver is gone with its report
            else:
                with lock:
                    self.ended[name] = report
                    while len(self.ended) > self._max_ended:
                        self.ended.popitem(last=False)
                    kept = self.store.progress(name) or {}
                    if report.step > kept.get("step", -1):  # steps since the last poll: what its checkpoint holds
                        last = {"samples_per_s": report.windows[-1].samples_per_s} if report.windows else {}
                        self.store.set_progress(name, {**kept, "step": report.step, "epoch": report.epoch, **last})
            live.handle.close()
            with lock:
                self._closing = [(n, x) for n, x in self._closing if x is not live]

    def held(self) -> dict[str, Resources]:
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
                per_node.setdefault(node, []).append(policy_resources(kind))
        return {n: total_of(rs) for n, rs in per_node.items()}

    # -- failures
    def count_failure(self, name: str) -> int:
        """One more failure of ``name`` (to start, or while running) since its last progress; how many now."""
        self._failures[name] = self._failures.get(name, 0) + 1
        return self._failures[name]

    def failures_of(self, name: str) -> int:
        """How many times the job failed since its last step of progress."""
        return self._failures.get(name, 0)

    def progressed(self, name: str, step: int) -> None:
        """The job trained ``step``: if no run of it got that far before, it made
        progress and its earlier failures are behind it. A run started again
        from a checkpoint redoes steps an earlier run made: those are no progress
        (a job that fails at the same step each time fails for good after
        MAX_FAILURES runs, not restarts forever)."""
        if step > self._furthest.get(name, -1):
            self._furthest[name] = step
            self._failures.pop(name, None)

    def may_start(self, name: str, now: float) -> bool:
        """Whether a job may be started at ``now``: not while it backs off after a failure (:meth:`backoff`)."""
        return self._not_before.get(name, float("-inf")) <= now

    def backoff(self, name: str, now: float) -> Waiting:
        """Why a job that failed is not started yet (see :meth:`may_start`)."""
        failures = self._failures.get(name, 0)
        wait_s = self._not_before[name] - now
        return Waiting(f"starts again from its latest checkpoint in {wait_s:.0f} s ({failures}/{MAX_FAILURES})")

    def stopped_by_failure(self, name: str, live: LiveJob, now: float, why: str) -> None:
        """A running job failed (its driver died, a task could not be placed on a
        node that just left, ...): start it again from its latest checkpoint at
        the next round, unless it has failed MAX_FAILURES times in a row without
        progress or its program itself is at fault."""
        failures = self.count_failure(name)
        if failures >= MAX_FAILURES or why.startswith(ProgramError.__name__):
            self.retire(name, live, JobState.FAILED, now, f"job failed: {why}")
            return
        self.release(name, live)
        wait_s = RESTART_BACKOFF_S * failures
        self._not_before[name] = now + wait_s
        again = f"it starts again from its latest checkpoint in {wait_s:g} s ({failures}/{MAX_FAILURES})"
        self.store.add_event(now, name, "error", f"{STOPPED}{why}; {again}")

    def fail_on_figures(self, name: str, now: float, why: str) -> None:
        """Fail a job whose figures the scheduler cannot work with (the round goes on without it)."""
        log.warning("job %s: its figures broke the scheduler: %s", name, why)
        message = f"job failed: its figures broke the scheduler ({why})"
        live = self.live.get(name)
        if live is not None:
            self.retire(name, live, JobState.FAILED, now, message)
        else:
            self.finish(name, JobState.FAILED, now, message)

    # -- what a round noted of a waiting job, and what admission checked
    @property
    def unfit(self) -> Mapping[str, str]:
        """Why each waiting job can never run here, as last stored (read-only)."""
        return MappingProxyType(self._unfit)

    def note_unfit(self, name: str, problem: str | None) -> bool:
        """Remember why a waiting job can never run here (None: it can now); True
        if that is news (a reason not stored yet, or a changed one)."""
        if problem is None:
            self._unfit.pop(name, None)
            return False
        news = self._unfit.get(name) != problem
        self._unfit[name] = problem
        return news

    def admitted(self, name: str) -> bool:
        """Whether this manager checked once that it may run the job's code."""
        return name in self._admitted

    def admit(self, name: str) -> None:
        self._admitted.add(name)

    # -- leaving for good
    def forget(self, name: str) -> None:
        """A deleted job: nothing held of it here may pass to a new job of its name."""
        self._run_over(name)
        self._admitted.discard(name)
        self.ended.pop(name, None)
        self.priors.forget(name)

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
  in a row of each job and when it may start again, and why each waiting job
  waits.

A job leaves the table in one of three ways, each here: it is released to
start again later (:meth:`JobTable.release`), it ends for good
(:meth:`JobTable.retire`, the store's state final), or it failed and starts
again after a backoff unless it failed too often (:meth:`JobTable.stopped_by_failure`).
Everything here is called with the manager's lock held, except the slow part
of :meth:`JobTable.drain` (stopping tasks), which takes the lock itself for
its bookkeeping.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass

from elasticps.errors import ElasticPSError, ProgramError
from elasticps.manager.rescale_costs import RescaleCosts
from elasticps.manager.runtime import JobHandle, JobStatus
from elasticps.manager.states import IllegalTransition, JobState
from elasticps.manager.store import Store
from elasticps.manager.task_resources import policy_resources
from elasticps.manager.waiting import Waiting
from elasticps.runtime import JobReport
from elasticps.sched import Resources
from elasticps.sched.types import total_of

log = logging.getLogger("elasticps.manager")

#: A job fails for good after this many failures in a row (to start, or while it runs) with
#: no step of progress between them; before that it starts again from its latest checkpoint.
MAX_FAILURES = 3
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
    """The manager's in-memory book of its jobs (see the module's docstring)."""

    def __init__(self, store: Store, rescale_costs: RescaleCosts, max_ended_reports: int = 200) -> None:
        self.store = store
        self.rescale_costs = rescale_costs  # a job's are forgotten when it ends
        self.live: dict[str, LiveJob] = {}
        self.waiting: dict[str, Waiting] = {}  # why each active job without a handle here is not running
        self.ended: OrderedDict[str, JobReport] = OrderedDict()  # final reports of jobs that ended here
        self.to_close: list[tuple[str, LiveJob]] = []  # handles to stop and release, drained by the loop
        self.closing: list[tuple[str, LiveJob]] = []  # being stopped and released now: their tasks still hold room
        self.failures: dict[str, int] = {}  # failures in a row with no progress, per job
        self.not_before: dict[str, float] = {}  # a job that failed starts again from then on
        self.unfit: dict[str, str] = {}  # the "cannot fit" message last stored per job
        self._max_ended = max_ended_reports

    # -- handles
    def stopping(self, name: str) -> bool:
        """Whether the job has a handle here, or one still being stopped and released."""
        return name in self.live or any(n == name for n, _ in self.to_close + self.closing)

    def release(self, name: str, live: LiveJob) -> None:
        """Drop the job's handle here; the loop stops its tasks and releases them."""
        self.live.pop(name, None)
        self.to_close.append((name, live))

    def retire(self, name: str, live: LiveJob, state: JobState, now: float, message: str) -> None:
        """Release the job's handle and give it its final state."""
        self.release(name, live)
        self.finish(name, state, now, message)

    def finish(self, name: str, state: JobState, now: float, message: str) -> None:
        """Give a job with no handle here its final state (a cancel meanwhile stands)."""
        self.rescale_costs.forget(name)
        self.waiting.pop(name, None)
        try:
            self.store.transition(name, state, now, message)
        except IllegalTransition as exc:  # e.g. cancelled meanwhile: the cancel stands
            log.info("%s", exc)

    def drain(self, lock: threading.RLock) -> None:
        """Stop and release the handles queued by commands and retirements
        (outside the lock: releasing tasks takes a while). The final report is
        kept under the lock: a delete forgets a name's report from an API thread."""
        with lock:
            closing, self.to_close = self.to_close, []
            self.closing += closing
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
            live.handle.close()
            with lock:
                self.closing = [(n, x) for n, x in self.closing if x is not live]

    def held(self) -> dict[str, Resources]:
        """What our jobs hold per node: what was asked, what they still hold while
        they switch, and what ended or cancelled jobs hold until they are released."""
        per_node: dict[str, list[Resources]] = {}
        for name, live in [*self.live.items(), *self.to_close, *self.closing]:
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
        self.failures[name] = self.failures.get(name, 0) + 1
        return self.failures[name]

    def progressed(self, name: str) -> None:
        """The job made a step of progress: its earlier failures are behind it."""
        self.failures.pop(name, None)

    def forget_failures(self, name: str) -> None:
        """A new run (a retry): no failures, no wait."""
        self.failures.pop(name, None)
        self.not_before.pop(name, None)

    def forget(self, name: str) -> None:
        """A deleted job: nothing held of it here may pass to a new job of its name."""
        self.forget_failures(name)
        self.ended.pop(name, None)
        self.unfit.pop(name, None)
        self.waiting.pop(name, None)
        self.rescale_costs.forget(name)

    def may_start(self, name: str, now: float) -> bool:
        return self.not_before.get(name, float("-inf")) <= now

    def backoff(self, name: str, now: float) -> Waiting:
        """Why a job that failed is not started yet (see :meth:`may_start`)."""
        failures = self.failures.get(name, 0)
        wait_s = self.not_before[name] - now
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
        self.not_before[name] = now + wait_s
        again = f"it starts again from its latest checkpoint in {wait_s:g} s ({failures}/{MAX_FAILURES})"
        self.store.add_event(now, name, "error", f"job stopped: {why}; {again}")

    def fail_on_figures(self, name: str, now: float, why: str) -> None:
        """Fail a job whose figures the scheduler cannot work with (the round goes on without it)."""
        log.warning("job %s: its figures broke the scheduler: %s", name, why)
        message = f"job failed: its figures broke the scheduler ({why})"
        live = self.live.get(name)
        if live is not None:
            self.retire(name, live, JobState.FAILED, now, message)
        else:
            self.finish(name, JobState.FAILED, now, message)

"""A round's last step: carry out what the policy and placement decided, and
say why the jobs left out wait.

A waiting job is started (its code checked again first), a running one is
asked for its new shape or global batch; the shape is recorded as the job's
``desired`` at once, and as its allocation only once a poll shows it applied
(:mod:`elasticps.manager.observe`). One job's failure to start or rescale is
an event, not the end of the round; a job that fails to start
``MAX_FAILURES`` times in a row fails. Every active job without a handle
here gets a reason it waits (:mod:`elasticps.manager.waiting`), and a job
that can never fit says why once. Called with the manager's lock held.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from elasticps.errors import ElasticPSError, JobEndedError
from elasticps.manager.admission import Admission
from elasticps.manager.live import MAX_FAILURES, JobTable, LiveJob
from elasticps.manager.pinning import CODE_DIR
from elasticps.manager.reasons import Move
from elasticps.manager.runtime import JobRuntime, Launch
from elasticps.manager.states import JobState
from elasticps.manager.store import JobRecord, Store
from elasticps.manager.task_resources import runtime_resources
from elasticps.manager.waiting import Waiting, free_after, why_waiting
from elasticps.manager.workdir import OUTPUT_DIR, job_dir
from elasticps.runtime import JobConfig
from elasticps.sched import ClusterView, JobView
from elasticps.sched.fit import fit_problem
from elasticps.tables import shape_text

log = logging.getLogger("elasticps.manager")


@dataclass
class Applier:
    """Carries out a round's decision (see the module's docstring): starts and
    rescales jobs, and notes why each job left out waits. Its only state is
    the current round's failed starts (:meth:`new_round` clears them)."""

    store: Store
    runtime: JobRuntime
    workdir: Path
    jobs: JobTable
    admission: Admission
    report_interval_s: float
    start_errors: dict[str, str] = field(default_factory=dict)  # this round's failed starts

    def new_round(self) -> None:
        """Forget the previous round's failed starts (a job's reason to wait is this round's)."""
        self.start_errors.clear()

    def apply(
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
        live = self.jobs.live.get(rec.name)
        if live is None and not self.admission.still_admissible(rec, now):
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
                    f"rescale to {shape_text(*shape)}{why} (the round saw {room} free for our jobs)",
                )
        except JobEndedError:
            pass  # it ended since this round polled it; the next poll retires it
        except ElasticPSError as exc:  # this job's trouble; the round goes on for the others
            verb = "start" if live is None else f"rescale to {shape[0]}x{shape[1]}"
            log.warning("job %s: could not %s: %s", rec.name, verb, exc)
            self.store.add_event(now, rec.name, "error", f"could not {verb}: {exc}")
            if live is None:
                self.start_errors[rec.name] = str(exc)
                failures = self.jobs.count_failure(rec.name)
                if failures >= MAX_FAILURES:
                    self.jobs.finish(rec.name, JobState.FAILED, now, f"job failed: {failures} starts failed: {exc}")

    def apply_batch(self, name: str, batch: int, now: float, why: Callable[[int], str]) -> None:
        """Ask a running job for a new global batch (once it has reported one); the event says ``why(batch)``."""
        live = self.jobs.live.get(name)
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

    def _start(self, rec: JobRecord, shape: tuple[int, int], placement: dict[str, str], now: float) -> None:
        spec = rec.spec
        folder = job_dir(self.workdir, rec.name)
        config = JobConfig(
            mode=spec.mode,
            checkpoint_dir=str(folder / "checkpoints"),
            checkpoint_every_steps=spec.checkpoint_every_steps,
            **({} if spec.step_timeout_s is None else {"step_timeout_s": spec.step_timeout_s}),
            standby_workers=spec.standby_workers,
            report_interval_s=self.report_interval_s,
            ps_resources=runtime_resources(spec.ps),
            worker_resources=runtime_resources(spec.workers),
        )
        env = spec.runtime_env.to_ray() if spec.runtime_env else None
        output, code = str(folder / OUTPUT_DIR), str(folder / CODE_DIR)
        launch = Launch(rec.name, spec.program, dict(spec.args), config, shape, dict(placement), env, output, code)
        live = LiveJob(self.runtime.start(launch), shape, dict(placement))
        try:  # a start the store cannot record (its database locked, its disk full) is released
            self.store.set_desired(rec.name, shape)
            with_shape = f"with {shape_text(*shape)}"
            if rec.state == JobState.RUNNING:  # running in the store, not here: the manager was restarted
                self.store.add_event(now, rec.name, "started", f"restarted from its latest checkpoint {with_shape}")
            else:
                self.store.transition(rec.name, JobState.RUNNING, now, f"started {with_shape}", kind="started")
        except BaseException:
            self.jobs.release(rec.name, live)  # never live here: the loop stops it
            raise
        self.jobs.started(rec.name, live)

    def note_unfit(self, views: list[JobView], cluster: ClusterView, now: float) -> None:
        """Store once why a waiting job can never run here (and again if the reason changes)."""
        for view in views:
            if view.current is not None:
                continue
            problem = fit_problem(view, cluster)
            if self.jobs.note_unfit(view.id, problem) and problem:
                self.store.add_event(now, view.id, "unfit", problem)

    def note_waiting(
        self, active: list[JobRecord], views: list[JobView], cluster: ClusterView, placed: dict, now: float
    ) -> None:
        """Say why each active job without a handle here is not running (see :mod:`.waiting`)."""
        by_id = {v.id: v for v in views}
        free = free_after(cluster, placed, by_id)
        for rec in active:
            if rec.name in self.jobs.live:
                continue
            view = by_id.get(rec.name)
            if not self.jobs.may_start(rec.name, now):
                why = self.jobs.backoff(rec.name, now)
            elif rec.name in self.start_errors:
                why = Waiting(f"could not start: {self.start_errors[rec.name]}")
            elif view is not None:
                why = why_waiting(view, cluster, free, len(placed))
            else:
                continue
            self.jobs.waits(rec.name, why)


def _why(move: Move | None, shape: tuple[int, int]) -> str:
    """``": grow"``, ``": shrink for job b"``, ... for a rescale event ("" if the round did not say)."""
    if move is None or move.shape != shape or move.action in ("keep", "admit", "wait", "unfit"):
        return ""
    return f": {move.why}"

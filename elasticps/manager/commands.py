"""What users ask of the manager through its API: submit, new limits, cancel,
retry, delete.

API calls are commands: each takes the manager's one lock, writes its durable
effect (a new job, a cancel, new limits) to the store, and wakes the loop;
whatever must happen to running tasks (stopping a cancelled job) is queued
for the loop, which drains the queue. A round holds the same lock, so a
round never sees half a command, and a cancelled job is never started again:
its state in the store is final. The slow parts of a submit (pinning the
code it ships, describing its program in a process of its own) run before
the lock is taken.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from elasticps.errors import ConfigError, UnschedulableError
from elasticps.manager.admission import Admission
from elasticps.manager.live import JobTable
from elasticps.manager.pinning import CODE_DIR, pin
from elasticps.manager.runtime import CapacitySource, JobRuntime, ProgramInfo
from elasticps.manager.spec import JobSpec, LimitsPatch, TaskSpec, validate_as
from elasticps.manager.states import IllegalTransition, JobInUse, JobState
from elasticps.manager.store import JobRecord, Store
from elasticps.manager.task_resources import policy_resources
from elasticps.manager.workdir import job_dir
from elasticps.sched import JobView
from elasticps.sched.fit import fit_problem


@dataclass
class Commands:
    """The API's commands (see the module's docstring), each under the manager's
    lock: its durable effect in the store, the job table told, the loop woken."""

    store: Store
    jobs: JobTable
    lock: threading.RLock  # the manager's: commands and rounds, one at a time
    wake: threading.Event  # set once a command's effect is stored: worth a round now
    clock: Callable[[], float]
    workdir: Path
    runtime: JobRuntime
    capacity: CapacitySource
    admission: Admission
    # set with the lock held by a change only a full round answers (new limits; elasticps.sched.rounds)
    reshape: threading.Event = field(default_factory=threading.Event)

    def submit(self, spec: JobSpec, nodes_fixed: bool = True) -> JobRecord:
        """Store a new job; its program is resolved first, outside this process.
        With ``nodes_fixed`` a job that can never fit on the cluster is refused."""
        self.admission.check(spec)
        if nodes_fixed:
            self._check_fits(spec)
        folder = job_dir(self.workdir, spec.name)
        fresh = not folder.exists()  # a folder of its own, or a job of that name already there (refused below)
        try:
            spec, pinned = self._pin(spec)
            info = self.runtime.describe(spec, str(folder / CODE_DIR) if pinned else None)
            _check_loop_spec(spec, info)
            with self.lock:
                rec = self.store.add_job(spec, self.clock(), info)
                self.jobs.submitted(spec.name)
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
        (the simulator's test of its workloads). With a growing cluster the
        nodes may change (no such check): the rounds say why it waits instead."""
        view = JobView(
            id=spec.name, speed=lambda p, w: 0.0, min_ps=spec.ps.min, max_ps=spec.ps.max,
            min_workers=spec.workers.min, max_workers=spec.workers.max,
            ps_resources=policy_resources(spec.ps), worker_resources=policy_resources(spec.workers),
        )  # fmt: skip
        with self.lock:
            cluster = self.capacity.view(self.jobs.held())
        problem = fit_problem(view, cluster)
        if problem is not None:
            raise UnschedulableError(f"job {spec.name!r} can never run on this cluster: {problem}")

    def set_limits(self, name: str, patch: LimitsPatch, nodes_fixed: bool = True) -> JobRecord:
        """Change a job's min/max PS and workers; the next round honours them.
        With ``nodes_fixed``, limits the cluster can never hold are refused, as at submit."""
        with self.lock:
            rec = self.store.get_job(name)
            if JobState(rec.state).ended:
                state = JobState(rec.state)
                raise IllegalTransition(name, state, state, f"job {name!r} is {state}: its limits no longer change")
            update: dict[str, Any] = {}
            for kind in ("ps", "workers"):
                part = getattr(patch, kind)
                if part is not None:
                    cur: TaskSpec = getattr(rec.spec, kind)
                    update[kind] = {**cur.model_dump(), **part.model_dump(exclude_none=True)}
            spec: JobSpec = validate_as(JobSpec, {**rec.spec.model_dump(), **update}, "job spec")
            if nodes_fixed:
                self._check_fits(spec)
            now = self.clock()
            self.store.update_spec(spec, now)
            self.store.add_event(
                now, name, "limits", f"PS {spec.ps.min}..{spec.ps.max}, workers {spec.workers.min}..{spec.workers.max}"
            )
            rec = self.store.get_job(name)
            self.reshape.set()
        self.wake.set()
        return rec

    def cancel(self, name: str) -> JobRecord:
        """Cancel for good (idempotent). The job's tasks stop within a round;
        no later round starts it again, and no late report overwrites it."""
        with self.lock:
            rec = self.store.get_job(name)
            if rec.state == JobState.CANCELLED:
                return rec
            rec = self.store.transition(name, JobState.CANCELLED, self.clock(), f"job {name} cancelled")
            self.jobs.cancelled(name)
        self.wake.set()
        return rec

    def retry(self, name: str) -> JobRecord:
        """Queue a failed or cancelled job again: a new run that resumes from
        its latest intact checkpoint (refused while its last run still stops)."""
        with self.lock:
            state = JobState(self.store.get_job(name).state)
            if state not in (JobState.FAILED, JobState.CANCELLED):  # not a run that is still stopping: say so
                raise IllegalTransition(
                    name, state, JobState.PENDING, f"job {name!r} is {state}: only failed or cancelled jobs are retried"
                )
            if self.jobs.in_use(name):
                raise JobInUse(f"job {name!r} is still stopping; retry it again in a moment")
            rec = self.store.transition(
                name, JobState.PENDING, self.clock(), f"job {name} retried: it resumes from its latest checkpoint",
                kind="retry",
            )  # fmt: skip
            self.jobs.retried(name)
        self.wake.set()
        return rec

    def delete(self, name: str) -> JobRecord:
        """Forget an ended job: its record, history and checkpoints; the name can
        be used again. A job that has not ended must be cancelled first."""
        with self.lock:
            rec = self.store.get_job(name)
            if not JobState(rec.state).ended:
                raise JobInUse(f"job {name!r} is {rec.state}; cancel it before deleting it")
            if self.jobs.in_use(name):
                raise JobInUse(f"job {name!r} is still stopping; delete it again in a moment")
            rec = self.store.delete_job(name)
            shutil.rmtree(job_dir(self.workdir, name), ignore_errors=True)
            self.store.add_event(self.clock(), None, "deleted", f"job {name} deleted ({rec.state}); its name is free")
            self.jobs.forget(name)
        return rec


def _check_loop_spec(spec: JobSpec, info: ProgramInfo) -> None:
    """What a user's own loop cannot do, refused at submit, not when its driver starts."""
    if not info.own_loop:
        return
    if spec.mode == "async":
        raise ConfigError(f"mode: async: {spec.program} is a user's own loop, which trains in sync mode only")
    if spec.standby_workers:
        raise ConfigError(
            f"standby_workers: {spec.program} is a user's own loop; standby workers are for a TrainingProgram's"
        )

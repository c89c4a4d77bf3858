"""What the manager needs from an execution engine, as two small protocols.

- :class:`JobRuntime` resolves a spec's program (in a process of its own,
  never the manager's) and starts jobs, each behind a :class:`JobHandle`.
- :class:`CapacitySource` says what the cluster has and what other tenants use.

:mod:`elasticps.manager.ray_runtime` implements both on Ray;
:mod:`elasticps.manager.fake` implements both in memory, with explicit fault
injection, for tests that exercise the manager's logic in milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from elasticps.manager.spec import JobSpec
from elasticps.runtime import JobConfig, JobReport, WindowReport
from elasticps.runtime.reports import RescaleRecord
from elasticps.sched import ClusterView, Resources


@dataclass(frozen=True)
class ProgramInfo:
    """What the scheduler needs to know of a program before it runs."""

    name: str
    batch_size: int
    epochs: int
    samples_per_epoch: int
    max_batch_size: int | None = None  # an adaptive batch may grow up to this (sync mode)
    own_loop: bool = False  # a user's own training loop (elasticps.torch), not a TrainingProgram


@dataclass(frozen=True)
class Launch:
    """Everything needed to start (or restart from its checkpoints) one job."""

    name: str
    program: str
    args: dict
    config: JobConfig
    shape: tuple[int, int]
    placement: dict[str, str]
    runtime_env: dict | None = None  # Ray's runtime_env for the job's processes (see JobSpec.runtime_env)
    output_dir: str | None = None  # where the job's own output is kept (elasticps.runtime.output.JobLog)
    code_dir: str | None = None  # the job's code as pinned at submit (elasticps.manager.pinning)


@dataclass(frozen=True)
class JobStatus:
    """One poll of a running job: what changed since the caller's last poll.

    ``state`` is the runtime's: ``created`` (starting), ``running``,
    ``finished``, ``failed`` or ``stopped``; ``ended`` is true once the job's
    loop has returned, so the state is final.
    """

    state: str
    ended: bool
    step: int
    epoch: int
    num_ps: int
    num_workers: int
    placement: dict[str, str]  # where each task in use runs
    held: dict[str, str]  # tasks holding resources: in use, or started for a pending rescale
    windows: list[WindowReport] = field(default_factory=list)  # those ending after the poll's ``after_step``
    events: list[str] = field(default_factory=list)  # runtime events after the poll's ``after_event``
    events_total: int = 0
    remaining_samples: int | None = None
    samples_per_epoch: int | None = None
    metric: float | None = None  # the latest epoch's metric (a user loop: the first value of its last report)
    metrics: dict[str, float | None] = field(default_factory=dict)  # a user loop's latest report
    error: str | None = None
    fatal: bool = False  # the program's own error (before its first step, or a rule broken): again fails again
    rescales: list[RescaleRecord] = field(default_factory=list)  # those after the poll's ``after_rescale``
    rescales_total: int = 0
    batch_size: int = 0  # the global batch now
    noise_scale: float | None = None  # the gradient noise scale: the median of the latest 3 epochs' estimates


class JobHandle(Protocol):
    def poll(self, after_step: int, after_event: int, after_rescale: int = 0) -> JobStatus:
        """The job's status, with the windows ending after ``after_step``, the
        events after the ``after_event``-th and the rescale records after the
        ``after_rescale``-th. Raises if the job is lost."""
        ...

    def report(self) -> JobReport: ...

    def rescale(self, num_ps: int, num_workers: int, placement: dict[str, str]) -> None:
        """Ask for a shape; applied at a step boundary once its tasks run.
        Raises ConfigError or PlacementError when it cannot be asked."""
        ...

    def set_batch_size(self, batch: int) -> None:
        """Ask for a global batch; applied at the next step boundary."""
        ...

    def stop(self) -> None:
        """Leave the loop at the next step boundary, writing a checkpoint."""
        ...

    def close(self) -> None:
        """Release every task and process of the job (idempotent)."""
        ...


class JobRuntime(Protocol):
    def describe(self, spec: JobSpec, code_dir: str | None = None) -> ProgramInfo:
        """Resolve the spec's program outside the manager (with the code pinned in
        ``code_dir``, if any); ProgramError if it cannot be."""
        ...

    def start(self, launch: Launch) -> JobHandle: ...


class CapacitySource(Protocol):
    def view(self, ours: dict[str, Resources]) -> ClusterView:
        """Nodes, their capacity and other tenants' use; ``ours`` is what our tasks hold per node."""
        ...

    def hostnames(self) -> dict[str, str]: ...

"""Runtime configuration of one job."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from elasticps.errors import ConfigError
from elasticps.limits import MAX_TASKS

#: How long one step may take before its late tasks are taken for hung (JobConfig.step_timeout_s).
DEFAULT_STEP_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class TaskResources:
    """What one PS or worker task asks of Ray.

    ``cpu_limit`` (cores, optional) caps the CPU time the task's process uses,
    as a container's CPU limit would; see :mod:`elasticps.runtime.cpu_limit`.
    """

    cpu: float = 1.0
    gpu: float = 0.0
    memory_bytes: int = 0
    cpu_limit: float | None = None

    def __post_init__(self) -> None:
        if self.cpu_limit is not None and self.cpu_limit <= 0:
            raise ConfigError(f"cpu_limit must be > 0 cores, got {self.cpu_limit}")

    def ray_options(self) -> dict[str, float | int]:
        opts: dict[str, float | int] = {"num_cpus": self.cpu, "num_gpus": self.gpu}
        if self.memory_bytes:
            opts["memory"] = self.memory_bytes
        return opts

    def as_ray_resources(self) -> dict[str, float]:
        res = {"CPU": self.cpu}
        if self.gpu:
            res["GPU"] = self.gpu
        if self.memory_bytes:
            res["memory"] = float(self.memory_bytes)
        return res


@dataclass(frozen=True)
class JobConfig:
    """How the runtime runs a job (the program says *what* it trains).

    Attributes:
        mode: ``sync`` (bulk-synchronous; exact for any shape) or ``async``
            (each worker's gradient applied as soon as it arrives).
        max_staleness: ``async`` only: a gradient computed on parameters more
            than this many updates old is discarded (None: no bound).
        checkpoint_dir: where checkpoints go; None disables them (and with
            them recovery from a lost PS shard, which then restarts at step 0).
        checkpoint_every_steps: steps between periodic checkpoints (0: only at
            the end of epochs and of the job).
        report_interval_s: length of one aggregated progress window.
        placement_timeout_s: how long a task may wait for room on its node
            before the request fails with :class:`PlacementError`; also how
            long the PS shards may take to hand over or take in the model's
            state (a checkpoint, a re-cut) before they count as failed.
        liveness_timeout_s: how long a task may take to answer a ping after a
            failure before it is declared dead.
        step_timeout_s: how long one step may take: its workers' gradients
            and its shards' updates (an async step: one worker's), a user
            loop's code between two steps (its evaluation at an epoch's end),
            and a task's own wait for another's part of a step. A task that has
            not answered by then is taken for hung: it is stopped and the job
            recovers as when it dies (an event names it). A slow step is not a
            hung one: set it well above the job's slowest step, the first
            included (a user loop's runs its code from ``prepare`` to its
            first batch, and the warm-up or compilation of its first forward
            and backward); the default, 10 minutes, is for steps of seconds.
        replace_dead_workers: start a replacement when a worker dies.
        shared_memory: ``sync`` only: tasks on the same node exchange gradients
            and parameters through shared memory instead of copies.
        gns_every_steps: measure the gradient noise scale every this many steps
            (0: never). A measured step runs the local batch as two halves;
            a user's own loop is measured only with two workers or more.
        share_dataset: workers take the training set the controller built, from
            Ray's object store (one copy per node), instead of each building
            its own: a new worker starts sooner (the demo's digits CNN: see
            ``elasticps bench runtime``). A dataset that cannot be pickled is
            built by each worker, as with False.
        standby_workers: how many worker processes the job keeps constructed
            ahead, holding no Ray resources while they wait (0: none; at most 1024). A grow
            takes a standby instead of starting a process (its node must be the
            one the slot is pinned to, and have room now); before it trains, a
            placement group reserves its ``worker_resources`` on its node, so
            Ray and other tenants see them used, and a shrink returns it to the
            standbys with that reservation released. The cost: each standby's
            process and its model's memory for the job's whole life, and its
            start's CPU, paid once while the job's first steps run. CPU workers
            of a program's own steps only (not a user's own loop, not GPUs).
        import_at_idle: a task started while the job trains (a grow's, a dead
            worker's replacement, a standby; a PS shard or a program's worker)
            imports torch and the runtime at idle CPU priority for up to half
            of ``placement_timeout_s`` (:mod:`elasticps.idle_start`), so that
            the tasks it starts beside keep their speed; its start takes longer
            where the cores are busy. False: at normal priority.
        ps_resources / worker_resources: what each task asks of Ray.
        ps_threads / worker_threads: torch intra-op threads per task.
    """

    mode: Literal["sync", "async"] = "sync"
    max_staleness: int | None = None
    checkpoint_dir: str | None = None
    checkpoint_every_steps: int = 100
    report_interval_s: float = 5.0
    placement_timeout_s: float = 60.0
    liveness_timeout_s: float = 10.0
    step_timeout_s: float = DEFAULT_STEP_TIMEOUT_S
    replace_dead_workers: bool = True
    standby_workers: int = 0
    gns_every_steps: int = 10
    shared_memory: bool = True
    share_dataset: bool = True
    import_at_idle: bool = True
    ps_resources: TaskResources = field(default_factory=lambda: TaskResources(cpu=1.0))
    worker_resources: TaskResources = field(default_factory=lambda: TaskResources(cpu=1.0))
    ps_threads: int = 1
    worker_threads: int = 1

    def __post_init__(self) -> None:
        if self.mode not in ("sync", "async"):
            raise ConfigError(f"mode must be 'sync' or 'async', got {self.mode!r}")
        if self.max_staleness is not None and (self.mode != "async" or self.max_staleness < 0):
            raise ConfigError("max_staleness needs mode='async' and a value >= 0")
        if self.gns_every_steps < 0:
            raise ConfigError("gns_every_steps must be >= 0")
        if self.checkpoint_every_steps < 0:
            raise ConfigError("checkpoint_every_steps must be >= 0")
        if isinstance(self.standby_workers, bool) or not isinstance(self.standby_workers, int):
            raise ConfigError(f"standby_workers must be an int, got {self.standby_workers!r}")
        if not 0 <= self.standby_workers <= MAX_TASKS:
            raise ConfigError(f"standby_workers must be 0..{MAX_TASKS}, got {self.standby_workers}")
        if self.standby_workers and self.worker_resources.gpu:
            raise ConfigError("standby_workers keeps CPU workers only: worker_resources asks for GPUs")
        for name in ("report_interval_s", "placement_timeout_s", "liveness_timeout_s", "step_timeout_s"):
            if not 0 < getattr(self, name) < math.inf:  # Ray's waits take finite timeouts only
                raise ConfigError(f"{name} must be > 0 and finite")

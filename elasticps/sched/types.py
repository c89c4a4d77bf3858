"""Plain records the policies read and return."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from elasticps.errors import ConfigError

#: A job's speed in samples/s as a function of (#PS, #workers).
SpeedFn = Callable[[int, int], float]
#: ... and of the global batch M: ``speed_at(p, w, M)``.
BatchSpeedFn = Callable[[int, int, int], float]


@dataclass(frozen=True)
class Resources:
    cpu: float = 0.0
    gpu: float = 0.0
    memory_gb: float = 0.0

    def __add__(self, o: Resources) -> Resources:
        return Resources(self.cpu + o.cpu, self.gpu + o.gpu, self.memory_gb + o.memory_gb)

    def __sub__(self, o: Resources) -> Resources:
        return Resources(self.cpu - o.cpu, self.gpu - o.gpu, self.memory_gb - o.memory_gb)

    def scaled(self, k: float) -> Resources:
        return Resources(self.cpu * k, self.gpu * k, self.memory_gb * k)

    def clamped(self) -> Resources:
        """No dimension below zero."""
        return Resources(max(0.0, self.cpu), max(0.0, self.gpu), max(0.0, self.memory_gb))

    def fits_in(self, o: Resources, eps: float = 1e-9) -> bool:
        return self.cpu <= o.cpu + eps and self.gpu <= o.gpu + eps and self.memory_gb <= o.memory_gb + eps

    def dominant_share(self, total: Resources) -> float:
        """The largest fraction of ``total`` this takes in any dimension."""
        shares = [
            a / b for a, b in ((self.cpu, total.cpu), (self.gpu, total.gpu), (self.memory_gb, total.memory_gb)) if b > 0
        ]
        return max(shares, default=0.0)


def tasks_of(ps: Resources, worker: Resources, p: int, w: int) -> Resources:
    """What ``p`` PS and ``w`` workers of these sizes take."""
    return ps.scaled(p) + worker.scaled(w)


def total_of(items: Iterable[Resources]) -> Resources:
    total = Resources()
    for r in items:
        total = total + r
    return total


@dataclass(frozen=True)
class NodeView:
    """A node: what it has, and what others (other tenants, other drivers) use of it."""

    name: str
    capacity: Resources
    used_by_others: Resources = Resources()

    @property
    def available(self) -> Resources:
        return (self.capacity - self.used_by_others).clamped()


@dataclass(frozen=True)
class ClusterView:
    nodes: tuple[NodeView, ...]

    # worked out once: a round asks for them per job and placement per move, and each sums every node
    @functools.cached_property
    def available(self) -> Resources:
        return total_of(n.available for n in self.nodes)

    @functools.cached_property
    def capacity(self) -> Resources:
        return total_of(n.capacity for n in self.nodes)


@dataclass(frozen=True)
class JobView:
    """What a policy knows of a job.

    ``speed(p, w)`` is the predicted samples/s (a fitted :class:`SpeedModel` or
    any callable; ``min_ps = max_ps = 0`` for a job with no PS).
    ``speed_sd(p, w)``, when given, is the relative standard deviation of that
    prediction as an estimate (what the elastic policy's spare-room growth
    weighs a small gain against; None: speeds known exactly).
    ``remaining_samples`` is the work left; ``current`` its shape now (None if
    not running); ``efficiency`` its statistical efficiency at its batch size
    (1.0 when unknown); ``objective`` overrides the cluster's.

    Adaptive batch (``batch_sizes`` non-empty and ``speed_at`` given): the
    policy may also choose the global batch among ``batch_sizes`` (the first is
    the reference M0, in whose samples ``remaining_samples`` counts), judged by
    ``speed_at(p, w, M)`` and the statistical efficiency from ``noise_scale``
    (see :func:`elasticps.sched.objectives.best_batch_of`).
    """

    id: str
    speed: SpeedFn
    min_ps: int = 1
    max_ps: int = 8
    min_workers: int = 1
    max_workers: int = 16
    ps_resources: Resources = Resources(cpu=1.0)
    worker_resources: Resources = Resources(cpu=1.0)
    remaining_samples: float = 1.0
    current: tuple[int, int] | None = None
    efficiency: float = 1.0
    objective: str | None = None
    static_shape: tuple[int, int] | None = None
    arrival: float = 0.0
    waited_s: float = 0.0
    explore: tuple[int, int] | None = field(default=None, compare=False)
    probes: tuple[tuple[int, int], ...] = field(default=(), compare=False)
    #: shapes the job has run (where its speed is measured, not the form's):
    #: growth may leap straight to one of them past a dip that steps of one
    #: kind of task at a time do not cross (:func:`~elasticps.sched.policies.base.grow`)
    measured: tuple[tuple[int, int], ...] = field(default=(), compare=False)
    batch_sizes: tuple[int, ...] = ()
    batch: int | None = None  # the global batch it trains at now (adaptive jobs)
    noise_scale: float | None = None
    speed_at: BatchSpeedFn | None = field(default=None, compare=False)
    #: the relative std of ``speed(p, w)`` as an estimate (None: known exactly)
    speed_sd: SpeedFn | None = field(default=None, compare=False)
    #: what a rescale costs this job, as measured: the seconds training stands
    #: still, and the seconds new tasks take to start while it trains on at its
    #: old shape (None: the policy's own figure, as a pause)
    rescale_pause_s: float | None = None
    rescale_launch_s: float = 0.0
    #: seconds since the job was submitted (None: not known); what policies that
    #: weigh time without a clock read (Pollux's restart factor, Tiresias's attained service)
    age_s: float | None = None

    def __post_init__(self) -> None:
        if not (0 <= self.min_ps <= self.max_ps) or not (1 <= self.min_workers <= self.max_workers):
            raise ConfigError(
                f"job {self.id}: need 0 <= min_ps <= max_ps and 1 <= min_workers <= max_workers, got "
                f"ps {self.min_ps}..{self.max_ps}, workers {self.min_workers}..{self.max_workers}"
            )

    def resources(self, p: int, w: int) -> Resources:
        return tasks_of(self.ps_resources, self.worker_resources, p, w)

    def allows(self, p: int, w: int) -> bool:
        """Whether (p, w) is within the job's limits."""
        return self.min_ps <= p <= self.max_ps and self.min_workers <= w <= self.max_workers


#: ``{job id: (num_ps, num_workers)}``; jobs absent wait.
Decision = dict[str, tuple[int, int]]

"""A simulated job (:class:`SimJob`: its work left, shape, placement, batch
and history) and the speed the ground truth gives it: as placed
(:func:`true_speed`), or with its tasks over as few nodes as hold them
(:func:`spanned_speed`, what the oracle decides with)."""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from elasticps.placement import cross_share
from elasticps.sched import Observation, SpeedModel
from elasticps.sched.goodput import statistical_efficiency
from elasticps.sched.synthetic import ModelKind, kind_speed
from elasticps.sim.config import SimConfig
from elasticps.sim.truth import OPTIMUS, OPTIMUS_TRUTH, Truth, busiest_on_a_node
from elasticps.sim.workload import WorkloadJob, noise_scale_at


@dataclass
class SimJob:
    spec: WorkloadJob
    kind: ModelKind
    remaining: float
    model: SpeedModel
    observations: list[Observation] = field(default_factory=list)
    shape: tuple[int, int] | None = None
    placement: dict[str, str] = field(default_factory=dict)
    paused_until: float = 0.0
    started: float | None = None
    finished: float | None = None
    rescales: int = 0
    history: list[tuple[float, int, int]] = field(default_factory=list)
    batch: int = 0  # the global batch it trains at
    batch_changes: int = 0
    speed_factor: float = 1.0  # this job's speed against its kind's (SimConfig.job_speed_spread)
    surface: str = OPTIMUS  # the truth surface its speed follows

    @property
    def done_share(self) -> float:
        return 1.0 - self.remaining / self.spec.samples

    def efficiency(self) -> float:
        """E of its batch now, relative to the kind's batch."""
        if self.batch == self.kind.batch:
            return 1.0
        return statistical_efficiency(self.batch, noise_scale_at(self.spec, self.done_share), self.kind.batch)


def true_speed(
    job: SimJob, p: int, w: int, placement: dict[str, str], local_factor: float, truth: Truth = OPTIMUS_TRUTH
) -> float:
    """Raw samples/s at the job's batch, as placed."""
    if job.kind.allreduce:
        nodes = len(set(placement.values())) if placement else w
        return job.speed_factor * kind_speed(job.kind, p, w, 1.0 - 1.0 / max(1, nodes), local_factor)
    if w < 1 or p < 1:
        return 0.0
    cross = cross_share(placement, job.kind.param_bytes, w)
    ps_nodes = Counter(n for task, n in placement.items() if task.startswith("ps-"))
    busiest = max(ps_nodes.values()) if ps_nodes else p
    return job.speed_factor * truth.speed(job.surface, job.kind, p, w, cross, local_factor, job.batch, busiest)


def spanned_speed(
    kind: ModelKind,
    p: int,
    w: int,
    nodes: int,
    local_factor: float,
    batch: int | None = None,
    truth: Truth = OPTIMUS_TRUTH,
    surface: str = OPTIMUS,
) -> float:
    """Ground-truth samples/s of a shape whose tasks are spread evenly over
    ``nodes`` nodes: a worker's PS traffic crosses nodes for the 1 - 1/nodes of
    PS shards that are elsewhere."""
    cross = 1.0 - 1.0 / max(1, nodes)
    return truth.speed(surface, kind, p, w, cross, local_factor, batch, busiest_on_a_node(p, nodes))


def span_of(spec: WorkloadJob, config: SimConfig) -> Callable[[int, int], int]:
    """How many nodes a shape's tasks need at least: what placement aims for."""

    def span(p: int, w: int) -> int:
        need = [(spec.ps_cpu * p + spec.worker_cpu * w) / config.node_cpu]
        if spec.worker_gpu > 0:
            need.append(spec.worker_gpu * w / config.node_gpu if config.node_gpu > 0 else math.inf)
        return max(1, math.ceil(max(need) - 1e-9))

    return span


def oracle_speed_at(
    job: SimJob, config: SimConfig, truth: Truth, surfaces: tuple[str, ...] | None = None
) -> Callable[[int, int, int], float]:
    """The job's true speed at a batch, with its tasks over as few nodes as they
    fit in; with ``surfaces``, the mean of its speeds were it to follow each
    (what is known of a job whose kind's surfaces are known, not its own)."""
    span = span_of(job.spec, config)
    among = surfaces or (job.surface,)

    def speed_at(p: int, w: int, batch: int | None) -> float:
        return job.speed_factor * statistics.fmean(
            spanned_speed(job.kind, p, w, span(p, w), config.local_traffic_factor, batch, truth, surface)
            for surface in among
        )

    return speed_at


def oracle_speed(
    job: SimJob, config: SimConfig, truth: Truth, surfaces: tuple[str, ...] | None = None
) -> Callable[[int, int], float]:
    """:func:`oracle_speed_at` at the kind's batch."""
    speed_at = oracle_speed_at(job, config, truth, surfaces)
    return lambda p, w: speed_at(p, w, None)

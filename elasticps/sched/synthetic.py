"""Synthetic jobs and clusters for benchmarks and the simulator (seeded, pure)."""

from __future__ import annotations

import random
from dataclasses import dataclass

from elasticps.sched.types import ClusterView, JobView, NodeView, Resources


@dataclass(frozen=True)
class ModelKind:
    """A kind of model: Optimus sync coefficients (seconds) and its parameter size."""

    name: str
    theta: tuple[float, float, float, float, float]
    param_bytes: float
    batch: int


#: Different PS/worker balances: compute bound, PS-bandwidth bound, balanced, small.
MODEL_KINDS: tuple[ModelKind, ...] = (
    ModelKind("resnet-like", (0.0040, 0.020, 0.060, 0.002, 0.004), 45e6, 128),
    ModelKind("vgg-like", (0.0030, 0.020, 0.300, 0.002, 0.006), 500e6, 128),
    ModelKind("transformer-like", (0.0060, 0.030, 0.150, 0.004, 0.004), 250e6, 64),
    ModelKind("mlp-small", (0.0008, 0.010, 0.010, 0.001, 0.002), 10e6, 256),
)


def optimus_samples_per_s(kind: ModelKind, p: int, w: int) -> float:
    """Ground truth: samples/s = M / (t0 M/w + t1 + t2 w/p + t3 w + t4 p)."""
    if w < 1 or p < 1:
        return 0.0
    t0, t1, t2, t3, t4 = kind.theta
    m = kind.batch
    return m / (t0 * m / w + t1 + t2 * w / p + t3 * w + t4 * p)


def synthetic_jobs(n: int, seed: int = 0, running_fraction: float = 0.5) -> list[JobView]:
    rng = random.Random(seed)
    jobs = []
    for i in range(n):
        kind = rng.choice(MODEL_KINDS)
        current = None
        if rng.random() < running_fraction:
            current = (rng.randint(1, 4), rng.randint(1, 8))
        jobs.append(
            JobView(
                id=f"job-{i:05d}",
                speed=lambda p, w, k=kind: optimus_samples_per_s(k, p, w),
                min_ps=1,
                max_ps=rng.choice([4, 8, 16]),
                min_workers=1,
                max_workers=rng.choice([8, 16, 32]),
                ps_resources=Resources(cpu=2.0, memory_gb=4.0),
                worker_resources=Resources(cpu=rng.choice([2.0, 4.0]), memory_gb=8.0),
                remaining_samples=rng.uniform(1e5, 1e8),
                current=current,
                arrival=float(i),
            )
        )
    return jobs


def synthetic_cluster(n: int, cpu: float = 32.0, memory_gb: float = 256.0, seed: int = 0) -> ClusterView:
    rng = random.Random(seed)
    return ClusterView(
        tuple(
            NodeView(
                f"node-{i:04d}",
                Resources(cpu=cpu, memory_gb=memory_gb),
                Resources(cpu=rng.choice([0.0, 0.0, 4.0, 8.0])),
            )
            for i in range(n)
        )
    )

"""Synthetic jobs and clusters for benchmarks and the simulator (seeded, pure)."""

from __future__ import annotations

import random
from dataclasses import dataclass

from elasticps.sched.types import ClusterView, JobView, NodeView, Resources


@dataclass(frozen=True)
class ModelKind:
    """A kind of model: Optimus sync coefficients (seconds) and its parameter size.

    With ``allreduce``, a data-parallel job with no PS whose workers (GPUs)
    all-reduce their gradients in a ring: ``theta = (t0, t1, ring within a
    node, ring across nodes, 0)``, see :func:`kind_speed`.
    """

    name: str
    theta: tuple[float, float, float, float, float]
    param_bytes: float
    batch: int
    allreduce: bool = False


#: Different PS/worker balances: compute bound, PS-bandwidth bound, balanced, small.
MODEL_KINDS: tuple[ModelKind, ...] = (
    ModelKind("resnet-like", (0.0040, 0.020, 0.060, 0.002, 0.004), 45e6, 128),
    ModelKind("vgg-like", (0.0030, 0.020, 0.300, 0.002, 0.006), 500e6, 128),
    ModelKind("transformer-like", (0.0060, 0.030, 0.150, 0.004, 0.004), 250e6, 64),
    ModelKind("mlp-small", (0.0008, 0.010, 0.010, 0.001, 0.002), 10e6, 256),
)


#: A ResNet-50-like job on GPUs, all-reduce, no PS: 4 GPUs on one node (1641
#: samples/s) beat 5 over two (1597), 8 over two (2024) beat both.
GPU_KINDS: tuple[ModelKind, ...] = (
    ModelKind("resnet50-allreduce", (0.0020, 0.010, 0.012, 0.030, 0.0), 100e6, 256, allreduce=True),
)


def kind_speed(kind: ModelKind, p: int, w: int, cross: float, local_factor: float, batch: int | None = None) -> float:
    """Ground-truth samples/s at (p, w) when ``cross`` of the traffic crosses nodes,
    at global batch ``batch`` (the kind's by default).

    PS kinds: ``M / (t0 M/w + t1 + t2 (w/p) (cross + (1 - cross) local_factor) + t3 w + t4 p)``.
    All-reduce kinds (p = 0): ``M / (t0 M/w + t1 + 2 (w-1)/w ring)``, the ring's
    time per byte set by its slowest link: across nodes as soon as any traffic is.
    """
    if w < 1:
        return 0.0
    t0, t1, t2, t3, t4 = kind.theta
    m = batch or kind.batch
    if kind.allreduce:
        ring = t3 if cross > 0 else t2
        return m / (t0 * m / w + t1 + 2.0 * (w - 1) / w * ring)
    if p < 1:
        return 0.0
    traffic = cross + (1.0 - cross) * local_factor
    return m / (t0 * m / w + t1 + t2 * (w / p) * traffic + t3 * w + t4 * p)


def optimus_samples_per_s(kind: ModelKind, p: int, w: int) -> float:
    """Ground truth with every task on one node, all traffic counted as crossing
    (PS kinds: M / (t0 M/w + t1 + t2 w/p + t3 w + t4 p))."""
    if kind.allreduce:
        return kind_speed(kind, p, w, 0.0, 1.0)
    return kind_speed(kind, p, w, 1.0, 1.0)


def synthetic_jobs(n: int, seed: int = 0, running_fraction: float = 0.5) -> list[JobView]:
    rng = random.Random(seed)
    jobs = []
    for i in range(n):
        kind = rng.choice(MODEL_KINDS)
        current = None
        if rng.random() < running_fraction:
            current = (rng.randint(1, 4), rng.randint(1, 8))
        max_ps, max_workers = rng.choice([4, 8, 16]), rng.choice([8, 16, 32])
        jobs.append(
            JobView(
                id=f"job-{i:05d}",
                speed=lambda p, w, k=kind: optimus_samples_per_s(k, p, w),
                min_ps=1,
                max_ps=max_ps,
                min_workers=1,
                max_workers=max_workers,
                ps_resources=Resources(cpu=2.0, memory_gb=4.0),
                worker_resources=Resources(cpu=rng.choice([2.0, 4.0]), memory_gb=8.0),
                remaining_samples=rng.uniform(1e5, 1e8),
                current=current,
                arrival=float(i),
                measured=_measured(random.Random(f"{seed}:measured:{i}"), current, max_ps, max_workers),
            )
        )
    return jobs


def _measured(
    rng: random.Random, current: tuple[int, int] | None, max_ps: int, max_workers: int
) -> tuple[tuple[int, int], ...]:
    """The shapes a running job has run (where growth may leap): its current one
    and up to four more, as a job's probes leave them (its own stream of draws,
    so the rest of the workload is the same with or without them)."""
    if current is None:
        return ()
    more = {(rng.randint(1, max_ps), rng.randint(1, max_workers)) for _ in range(4)}
    return tuple(sorted({current} | more))


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

"""Workloads: jobs arriving over time, from a file (CSV or JSONL) or generated."""

from __future__ import annotations

import csv
import json
import random
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from elasticps.errors import ConfigError
from elasticps.sched.synthetic import GPU_KINDS, MODEL_KINDS, ModelKind, optimus_samples_per_s

KINDS = {k.name: k for k in MODEL_KINDS + GPU_KINDS}
#: A job's gradient noise scale grows this many times over its training (it
#: grows by about an order of magnitude as the loss falls: McCandlish et al.,
#: "An Empirical Model of Large-Batch Training", 2018).
NOISE_GROWTH = 10.0


def job_speed_factor(spec: WorkloadJob, seed: int, sigma: float) -> float:
    """A job's true speed against its kind's: lognormal(0, ``sigma``), drawn from
    the job's own stream (the same job, the same factor, whatever the policy)."""
    if sigma <= 0:
        return 1.0
    return random.Random(f"{seed}:{spec.id}").lognormvariate(0.0, sigma)


def noise_scale_at(job: WorkloadJob, done: float) -> float:
    """The job's noise scale once ``done`` (0..1) of its work is done: geometric growth."""
    return job.noise_scale * NOISE_GROWTH ** min(1.0, max(0.0, done))


@dataclass(frozen=True)
class WorkloadJob:
    """One job of a workload. ``samples`` is the total work, in samples at the
    kind's batch; the static shape is (``static_ps``, ``static_workers``), what
    the user asked for. ``max_batch`` > the kind's batch: an adaptive batch;
    ``noise_scale``: the gradient noise scale at the start (0: unknown, every
    batch as efficient), growing :data:`NOISE_GROWTH`-fold by the end."""

    id: str
    arrival_s: float
    kind: str
    samples: float
    min_ps: int = 1
    max_ps: int = 8
    min_workers: int = 1
    max_workers: int = 16
    static_ps: int = 2
    static_workers: int = 4
    ps_cpu: float = 2.0
    worker_cpu: float = 4.0
    ps_memory_gb: float = 4.0
    worker_memory_gb: float = 8.0
    worker_gpu: float = 0.0
    max_batch: int = 0
    noise_scale: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"job {self.id}: kind must be one of {sorted(KINDS)}, got {self.kind!r}")
        if KINDS[self.kind].allreduce and (self.max_ps != 0 or self.worker_gpu <= 0):
            raise ConfigError(
                f"job {self.id}: an all-reduce kind has no PS (max_ps 0) and GPU workers (worker_gpu > 0)"
            )
        if self.max_batch and (KINDS[self.kind].allreduce or self.max_batch < KINDS[self.kind].batch):
            raise ConfigError(
                f"job {self.id}: max_batch must be >= the kind's batch ({KINDS[self.kind].batch}), PS kinds only"
            )
        if self.noise_scale < 0:
            raise ConfigError(f"job {self.id}: noise_scale must be >= 0")
        if self.samples <= 0 or self.arrival_s < 0:
            raise ConfigError(f"job {self.id}: samples must be > 0 and arrival_s >= 0")
        if not (
            self.min_ps <= self.static_ps <= self.max_ps and self.min_workers <= self.static_workers <= self.max_workers
        ):
            raise ConfigError(f"job {self.id}: the static shape must lie within min/max")


def job_at_shape(
    job_id: str,
    arrival_s: float,
    kind: ModelKind,
    ps: int,
    workers: int,
    duration_s: float,
    worker_cpu: float = 4.0,
    **extra: float,
) -> WorkloadJob:
    """A job asking for (``ps``, ``workers``) whose work takes ``duration_s`` at that
    shape. A PS kind may grow to 8 PS and 16 workers (or what it asks, if more); an
    all-reduce kind has no PS and a GPU a worker (``ps`` is ignored)."""
    if kind.allreduce:
        return WorkloadJob(
            id=job_id,
            arrival_s=arrival_s,
            kind=kind.name,
            samples=optimus_samples_per_s(kind, 0, workers) * duration_s,
            min_ps=0,
            max_ps=0,
            static_ps=0,
            static_workers=workers,
            max_workers=max(16, workers),
            worker_cpu=4.0,
            worker_gpu=1.0,
            worker_memory_gb=16.0,
            **extra,
        )
    return WorkloadJob(
        id=job_id,
        arrival_s=arrival_s,
        kind=kind.name,
        samples=optimus_samples_per_s(kind, ps, workers) * duration_s,
        max_ps=max(8, ps),
        max_workers=max(16, workers),
        static_ps=ps,
        static_workers=workers,
        worker_cpu=worker_cpu,
        **extra,
    )


def synthetic_workload(
    num_jobs: int,
    seed: int = 0,
    mean_interarrival_s: float = 30.0,
    mean_duration_s: float = 3600.0,
    gpu_share: float = 0.0,
    adaptive_share: float = 0.0,
) -> list[WorkloadJob]:
    """Poisson arrivals; model kinds mixed; work sized so that a job at its
    static shape would take a lognormal time around ``mean_duration_s``.
    ``gpu_share`` of the jobs are all-reduce GPU jobs (no PS, 1 GPU per worker,
    asking 2, 4 or 8 GPUs); the rest are drawn as without it. ``adaptive_share``
    of the PS jobs have an adaptive batch (up to 8x the kind's) and a noise
    scale starting at 0.25-2x the kind's batch; the others are unchanged."""
    rng = random.Random(seed)
    gpu_rng = random.Random(seed + 7919)  # a separate stream: the PS jobs stay those of gpu_share = 0
    batch_rng = random.Random(seed + 104729)  # likewise for adaptive_share
    t = 0.0
    jobs = []
    for i in range(num_jobs):
        t += rng.expovariate(1.0 / mean_interarrival_s)
        kind = rng.choice(MODEL_KINDS)
        static = (rng.choice([1, 2, 4]), rng.choice([2, 4, 8]))
        duration = mean_duration_s * rng.lognormvariate(0.0, 0.8) / 1.377  # lognormal mean exp(0.32) = 1.377
        worker_cpu = rng.choice([2.0, 4.0])
        if gpu_share > 0 and gpu_rng.random() < gpu_share:
            gpu = gpu_rng.choice(GPU_KINDS)
            jobs.append(job_at_shape(f"job-{i:05d}", round(t, 3), gpu, 0, gpu_rng.choice([2, 4, 8]), duration))
            continue
        adaptive = {}
        if adaptive_share > 0 and batch_rng.random() < adaptive_share:
            adaptive = {
                "max_batch": 8 * kind.batch,
                "noise_scale": kind.batch * batch_rng.choice([0.25, 0.5, 1.0, 2.0]),
            }
        jobs.append(job_at_shape(f"job-{i:05d}", round(t, 3), kind, *static, duration, worker_cpu, **adaptive))
    return jobs


def load_workload(path: str | Path) -> list[WorkloadJob]:
    """Read jobs from CSV (a header naming :class:`WorkloadJob` fields) or JSONL."""
    path = Path(path)
    names = {f.name: f.type for f in fields(WorkloadJob)}
    if path.suffix == ".jsonl":
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    elif path.suffix == ".csv":
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    else:
        raise ConfigError(f"workload {path}: use a .csv or .jsonl file")
    jobs = []
    for n, row in enumerate(rows, start=1):
        unknown = set(row) - set(names)
        if unknown:
            raise ConfigError(f"workload {path} row {n}: unknown fields {sorted(unknown)}")
        try:
            kw = {
                k: (str(v) if names[k] == "str" else int(v) if names[k] == "int" else float(v)) for k, v in row.items()
            }
            if kw.get("kind") in KINDS and KINDS[kw["kind"]].allreduce:  # no PS: its PS fields default to 0
                kw = {"min_ps": 0, "max_ps": 0, "static_ps": 0, **kw}
            jobs.append(WorkloadJob(**kw))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"workload {path} row {n}: {exc}") from exc
    return sorted(jobs, key=lambda j: (j.arrival_s, j.id))


def save_workload(jobs: list[WorkloadJob], path: str | Path) -> None:
    path = Path(path)
    with open(path, "w") as f:
        for j in jobs:
            f.write(json.dumps(asdict(j)) + "\n")

"""Trace-shaped workloads: arrivals with a daily cycle and bursts, heavy-tailed
durations and jobs of several sizes, as production GPU clusters show them; and
a loader for a trace CSV (submit time, duration, GPUs asked).

The shapes follow the characterizations of three published production traces:
- Microsoft Philly: Jeon et al., "Analysis of Large-Scale Multi-Tenant GPU
  Clusters for DNN Training Workloads", USENIX ATC'19 (the released trace
  holds 117,325 jobs over about five months);
- Alibaba PAI: Weng et al., "MLaaS in the Wild: Workload Analysis and
  Scheduling in Large-Scale Heterogeneous GPU Clusters", NSDI'22 (two months,
  6,742 GPUs, over 1,300 users);
- SenseTime Helios: Hu et al., "Characterization and Prediction of Deep
  Learning Workloads in Large-Scale GPU Datacenters", SC'21 (four clusters,
  3,362,981 jobs of which 1,580,464 GPU jobs, April to September 2020).
All three report submissions that follow the working day, durations spanning
seconds to weeks (a heavy tail) and mostly small jobs with a few large ones.
Where a published trace gives a figure, the default is set from it (the
sources are files the traces' authors released; docs/simulator.md gives
their paths and what was read from them):
- durations: log-normal, median ``median_duration_s`` = 1200 s and sigma
  ``duration_sigma`` = 2.2, from the Philly run times the PAI authors
  released beside their trace (median ~1180 s, p90 ~12,800 s, p99 ~2.6e5 s,
  p10 ~60 s; a sigma fitted to those quantiles in log space, 2.2 to 2.3: no
  log-normal meets them all: this one puts p10 at 72 s, p90 at 20,100 s
  and p99 at 2.0e5 s). The mean is exp(sigma^2 / 2) = 11x the median. A
  draw longer than ``max_duration_s`` = 4.6e6 s, the longest run in that file
  (53 days), is drawn again: the log-normal's tail reaches past anything the
  trace ran, and one such job would alone decide a run's averages. Helios'
  GPU jobs (median 206 s, mean 6652 s: Helios' released cluster summary) have
  a shorter median and a heavier tail still.
- sizes (GPUs asked): :data:`GPU_SIZE_MIX`, whose mean (3.75 GPUs) and median
  (1: more than half the jobs ask one) are those of Helios' GPU jobs (3.716
  and 1, the same summary); the split among 2, 4, 8 and 16 GPUs is an
  ASSUMPTION (the papers give it in plots).
These stay ASSUMPTIONS, no released figure found for them:
- ``peak_to_trough`` = 3.0: the hourly submission rate at the day's peak over
  the rate at its trough (a cosine over 24 h, peaking at ``peak_hour`` = 15).
- ``mean_batch`` = 2.0: submissions come in batches (hyper-parameter sweeps, a
  user's several runs), a geometric number of jobs of one kind and size each,
  within seconds of one another: the bursts.
Each is a parameter, to be set from a trace at hand (or replace the generator
by :func:`load_trace_csv`).

A job asking ``g`` GPUs becomes ``g`` workers of a PS kind (drawn as in
:func:`~elasticps.sim.workload.synthetic_workload`) with ``ceil(g / 2)`` PS
(the synthetic workload's median PS:worker ratio), or, for ``gpu_share`` of
the jobs, an all-reduce job on ``g`` GPUs. Pure and seeded; the CSV loader is
the only I/O.
"""

from __future__ import annotations

import csv
import math
import random
from pathlib import Path

from elasticps.errors import ConfigError
from elasticps.sched.synthetic import GPU_KINDS, MODEL_KINDS, ModelKind
from elasticps.sim.workload import KINDS, WorkloadJob, job_at_shape

DAY_S = 86400.0
#: GPUs a job asks -> share of the jobs: mean 3.75 and median 1 as Helios' GPU jobs; the split an ASSUMPTION.
GPU_SIZE_MIX: dict[int, float] = {1: 0.55, 2: 0.08, 4: 0.10, 8: 0.21, 16: 0.06}
#: The trace CSV's columns: the required ones, then the optional ones.
TRACE_COLUMNS = ("submit_time_s", "duration_s", "num_gpus")
TRACE_OPTIONAL = ("id", "kind")
#: Seconds over which the jobs of one burst are submitted (mean gap between them).
BURST_GAP_S = 10.0


def diurnal_rate(t_s: float, peak_to_trough: float, peak_hour: float) -> float:
    """The submission rate at ``t_s`` relative to the day's mean: a cosine over 24 h,
    ``peak_to_trough`` times higher at ``peak_hour`` than twelve hours later."""
    amplitude = (peak_to_trough - 1.0) / (peak_to_trough + 1.0)
    return 1.0 + amplitude * math.cos(2.0 * math.pi * (t_s / DAY_S - peak_hour / 24.0))


def ps_for_workers(workers: int) -> int:
    """PS a job of ``workers`` workers asks for: one per two workers, at least one."""
    return max(1, math.ceil(workers / 2))


def _job(
    job_id: str, arrival_s: float, kind: ModelKind, gpus: int, duration_s: float, worker_cpu: float
) -> WorkloadJob:
    """A job asking ``gpus`` GPUs, mapped to this project's shapes (module docstring)."""
    return job_at_shape(job_id, arrival_s, kind, ps_for_workers(gpus), gpus, duration_s, worker_cpu)


def trace_workload(
    num_jobs: int,
    seed: int = 0,
    mean_interarrival_s: float = 300.0,
    peak_to_trough: float = 3.0,
    peak_hour: float = 15.0,
    mean_batch: float = 2.0,
    median_duration_s: float = 1200.0,
    duration_sigma: float = 2.2,
    max_duration_s: float = 4.6e6,
    size_mix: dict[int, float] | None = None,
    gpu_share: float = 0.0,
) -> list[WorkloadJob]:
    """``num_jobs`` jobs arriving ``mean_interarrival_s`` apart on average over the
    day (t = 0 is midnight), the rate following :func:`diurnal_rate`; each arrival
    brings a burst of ``mean_batch`` jobs on average (geometric), of one kind and
    size. Durations log-normal (median, sigma), drawn again above ``max_duration_s``; sizes from ``size_mix``
    (:data:`GPU_SIZE_MIX` by default). ``gpu_share`` of the bursts are all-reduce
    GPU jobs. Where the defaults come from: see the module's docstring."""
    mix = GPU_SIZE_MIX if size_mix is None else size_mix
    if peak_to_trough < 1.0 or mean_batch < 1.0 or median_duration_s <= 0 or duration_sigma < 0:
        raise ConfigError("trace workload: peak_to_trough and mean_batch >= 1, median_duration_s > 0, sigma >= 0")
    if max_duration_s <= median_duration_s:
        raise ConfigError(f"trace workload: max_duration_s ({max_duration_s:g}) must be above the median duration")
    if not mix or any(g < 1 or share < 0 for g, share in mix.items()) or sum(mix.values()) <= 0:
        raise ConfigError(f"trace workload: size_mix must map GPUs >= 1 to shares >= 0, got {mix}")
    if not 0.0 <= gpu_share <= 1.0 or mean_interarrival_s <= 0:
        raise ConfigError("trace workload: gpu_share in 0..1 and mean_interarrival_s > 0")
    rng = random.Random(f"trace:{seed}")
    sizes, weights = list(mix), list(mix.values())
    peak = diurnal_rate(peak_hour * 3600.0, peak_to_trough, peak_hour)  # the rate's maximum, relative to its mean
    peak_rate = peak / (mean_interarrival_s * mean_batch)  # bursts a second at the peak
    t = 0.0
    drawn: list[tuple[float, ModelKind, int, float, float]] = []  # (arrival, kind, GPUs, duration, worker CPUs)
    while len(drawn) < num_jobs:
        t += rng.expovariate(peak_rate)  # thinning: a candidate kept at the rate's share of its peak
        if rng.random() * peak > diurnal_rate(t, peak_to_trough, peak_hour):
            continue
        burst = 1 + (int(math.log(rng.random()) / math.log(1.0 - 1.0 / mean_batch)) if mean_batch > 1.0 else 0)
        gpu = gpu_share > 0 and rng.random() < gpu_share
        kind = rng.choice(GPU_KINDS) if gpu else rng.choice(MODEL_KINDS)
        gpus = rng.choices(sizes, weights)[0]
        worker_cpu = rng.choice([2.0, 4.0])
        arrival = t
        for _ in range(min(burst, num_jobs - len(drawn))):
            duration = math.inf
            while duration > max_duration_s:
                duration = median_duration_s * rng.lognormvariate(0.0, duration_sigma)
            drawn.append((round(arrival, 3), kind, gpus, duration, worker_cpu))
            arrival += rng.expovariate(1.0 / BURST_GAP_S)
    drawn.sort(key=lambda d: d[0])  # a burst's tail may pass the next burst's start: numbered in arrival order
    return [_job(f"job-{i:05d}", *d) for i, d in enumerate(drawn)]


def load_trace_csv(path: str | Path, seed: int = 0) -> list[WorkloadJob]:
    """Jobs from a trace CSV: a header row naming ``submit_time_s``, ``duration_s``
    and ``num_gpus`` (GPUs asked), and optionally ``id`` and ``kind`` (a model kind:
    an all-reduce kind makes a GPU job; without it, a PS kind drawn per row from
    ``seed``). Submit times are shifted so that the first is 0; each row becomes a
    job as :func:`trace_workload` makes them (4 CPUs a worker). A bad row is a
    :class:`ConfigError` naming its row (1 = the first after the header) and column."""
    path = Path(path)
    try:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            header = list(reader.fieldnames or [])
            rows = list(reader)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise ConfigError(f"trace {path}: {exc}") from exc
    missing = [c for c in TRACE_COLUMNS if c not in header]
    unknown = [c for c in header if c not in TRACE_COLUMNS + TRACE_OPTIONAL]
    if missing or unknown:
        raise ConfigError(
            f"trace {path}: columns must include {', '.join(TRACE_COLUMNS)} and may add {', '.join(TRACE_OPTIONAL)}"
            + (f"; missing {', '.join(missing)}" if missing else "")
            + (f"; unknown {', '.join(unknown)}" if unknown else "")
        )
    parsed = []
    for n, row in enumerate(rows, start=1):
        if None in row or any(row[c] is None for c in header):
            raise ConfigError(f"trace {path} row {n}: expected {len(header)} columns")
        submit = _number(path, n, row, "submit_time_s", minimum=0.0)
        duration = _number(path, n, row, "duration_s", minimum=0.0, strict=True)
        gpus = _number(path, n, row, "num_gpus", minimum=1.0)
        if gpus != int(gpus):
            raise ConfigError(f"trace {path} row {n} column num_gpus: expected a whole number, got {row['num_gpus']!r}")
        kind_name = (row.get("kind") or "").strip()
        if kind_name and kind_name not in KINDS:
            raise ConfigError(f"trace {path} row {n} column kind: expected one of {sorted(KINDS)}, got {kind_name!r}")
        kind = KINDS[kind_name] if kind_name else random.Random(f"trace-csv:{seed}:{n}").choice(MODEL_KINDS)
        job_id = (row.get("id") or "").strip() or f"job-{n:05d}"
        parsed.append((n, job_id, submit, kind, int(gpus), duration))
    if not parsed:
        raise ConfigError(f"trace {path}: no rows")
    seen: dict[str, int] = {}
    for n, job_id, *_ in parsed:
        if job_id in seen:
            raise ConfigError(f"trace {path} row {n} column id: {job_id!r} already on row {seen[job_id]}")
        seen[job_id] = n
    start = min(p[2] for p in parsed)
    jobs = [
        _job(job_id, round(submit - start, 3), kind, gpus, duration, 4.0)
        for _, job_id, submit, kind, gpus, duration in parsed
    ]
    return sorted(jobs, key=lambda j: (j.arrival_s, j.id))


def _number(path: Path, n: int, row: dict, column: str, minimum: float, strict: bool = False) -> float:
    """Column ``column`` of row ``n`` as a finite number >= ``minimum`` (> with ``strict``)."""
    text = (row[column] or "").strip()
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < minimum or (strict and value == minimum):
        bound = f"above {minimum:g}" if strict else f"{minimum:g} or more"
        raise ConfigError(f"trace {path} row {n} column {column}: expected a number, {bound}, got {text!r}")
    return value

"""What a policy maximises for a job.

- ``speed``: raw samples/s (an adaptive job's largest batch, where steps are cheapest per sample).
- ``goodput`` (default): samples/s x statistical efficiency E(M) (see :mod:`.goodput`),
  the batch chosen per shape to maximise it: progress per second.
- ``efficiency``: goodput, but a job grows only while each step keeps its
  marginal efficiency -- relative goodput gain over relative growth in the
  job's dominant share of the cluster (1.0 is linear scaling) -- at or above
  a threshold (0.75 by default: an added CPU must bring at least 3/4 of
  what each CPU the job holds already brings).

With a fixed batch, E is a constant factor per job, so goodput and speed
decide alike; they differ for jobs whose batch adapts.
"""

from __future__ import annotations

from dataclasses import replace
from enum import StrEnum

from elasticps.errors import ConfigError
from elasticps.sched.goodput import best_batch, statistical_efficiency
from elasticps.sched.types import Decision, JobView

DEFAULT_EFFICIENCY_THRESHOLD = 0.75


class Objective(StrEnum):
    GOODPUT = "goodput"
    SPEED = "speed"
    EFFICIENCY = "efficiency"

    @classmethod
    def parse(cls, value: str | Objective) -> Objective:
        try:
            return cls(value)
        except ValueError:
            raise ConfigError(f"objective must be one of {[o.value for o in cls]}, got {value!r}") from None


def utility(job: JobView, p: int, w: int, objective: Objective) -> float:
    """The quantity the objective values for ``job`` at shape (p, w), at the
    best batch for it."""
    return best_batch_of(job, p, w, objective)[1]


def best_batch_of(job: JobView, p: int, w: int, objective: Objective) -> tuple[int | None, float]:
    """The global batch the objective prefers for ``job`` at (p, w) (None: the
    batch is fixed), and the utility there. ``speed`` takes the batch with the
    most samples/s; ``goodput`` and ``efficiency`` the most samples/s x E(M)
    (ties: the smaller batch). Under ``goodput`` and ``efficiency``, a job whose
    noise scale is not measured yet (a user's loop on one worker never measures
    one) stays at its smallest batch, the user's: what a larger batch costs in
    samples is unknown, and taking the fastest would take the largest."""
    if not job.batch_sizes or job.speed_at is None:
        speed = max(0.0, float(job.speed(p, w)))
        return None, speed if objective is Objective.SPEED else speed * job.efficiency
    speed_at = job.speed_at
    noise = None if objective is Objective.SPEED else job.noise_scale  # speed: every batch counts as efficient
    candidates = list(job.batch_sizes)
    if objective is not Objective.SPEED and noise is None:
        candidates = candidates[:1]
    batch, value = best_batch(lambda m: max(0.0, float(speed_at(p, w, int(m)))), noise, job.batch_sizes[0], candidates)
    return int(batch), value


def utility_at_batch(job: JobView, p: int, w: int, batch: int, objective: Objective) -> float:
    """An adaptive job's utility at (p, w) and global batch ``batch``."""
    assert job.speed_at is not None and job.batch_sizes
    speed = max(0.0, float(job.speed_at(p, w, batch)))
    if objective is Objective.SPEED:
        return speed
    return speed * statistical_efficiency(batch, job.noise_scale, job.batch_sizes[0])


def marginal_efficiency(u_old: float, u_new: float, held_old: float, held_new: float) -> float:
    """(relative utility gain) / (relative growth in what the job holds); 1.0 is linear scaling."""
    if u_old <= 0 or held_old <= 0:
        return float("inf") if u_new > 0 else 0.0
    return ((u_new - u_old) / u_old) / ((held_new - held_old) / held_old)


def objective_of(job: JobView, default: Objective) -> Objective:
    """The job's own objective, else ``default`` (the cluster's)."""
    return Objective.parse(job.objective) if job.objective else default


#: A job keeps its batch unless another is this much better (the noise scale
#: is measured with noise: without it, a job's batch flips from round to round).
BATCH_MIN_GAIN = 0.05
#: A batch grows at most this many times per decision: the noise scale is
#: re-measured at each size before the next step up (a live CNN on digits went
#: 128 -> 1024 in one step, with sqrt-scaled lr, and diverged).
BATCH_MAX_GROWTH = 2


def batches_for(jobs: list[JobView], decision: Decision, default: Objective | str) -> dict[str, int]:
    """The global batch of each adaptive job the ``decision`` runs: the best for
    its shape under its objective among those at most :data:`BATCH_MAX_GROWTH`
    times its current one, unless its current batch is within
    :data:`BATCH_MIN_GAIN` of it (what a driver applies with the shape)."""
    default = Objective.parse(default)
    out: dict[str, int] = {}
    for job in jobs:
        if job.id not in decision or not job.batch_sizes:
            continue
        objective = objective_of(job, default)
        reachable = job
        if job.batch is not None:
            reachable = replace(job, batch_sizes=tuple(m for m in job.batch_sizes if m <= BATCH_MAX_GROWTH * job.batch))
        batch, value = best_batch_of(reachable, *decision[job.id], objective)
        if batch is None:
            continue
        if job.batch in job.batch_sizes and job.batch != batch:
            here = utility_at_batch(job, *decision[job.id], job.batch, objective)
            if value <= here * (1.0 + BATCH_MIN_GAIN):
                batch = job.batch
        out[job.id] = batch
    return out

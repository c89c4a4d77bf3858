"""What a policy maximises for a job.

- ``speed``: raw samples/s.
- ``goodput`` (default): samples/s x statistical efficiency (see :mod:`.goodput`).
- ``efficiency``: samples/s, but a job grows only while each added task keeps
  its marginal efficiency -- relative speed gain over relative resource
  increase (1.0 is linear scaling) -- at or above a threshold.
"""

from __future__ import annotations

from enum import StrEnum

from elasticps.errors import ConfigError
from elasticps.sched.types import JobView

DEFAULT_EFFICIENCY_THRESHOLD = 0.5


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
    """The quantity the objective values for ``job`` at shape (p, w)."""
    speed = max(0.0, float(job.speed(p, w)))
    return speed * job.efficiency if objective is Objective.GOODPUT else speed


def marginal_efficiency(u_old: float, u_new: float, tasks_old: int, tasks_new: int) -> float:
    """(relative utility gain) / (relative growth in tasks); 1.0 is linear scaling."""
    if u_old <= 0 or tasks_old <= 0:
        return float("inf") if u_new > 0 else 0.0
    return ((u_new - u_old) / u_old) / ((tasks_new - tasks_old) / tasks_old)

"""What a rescale costs a job here, learned from the runtime's records.

Two figures, each the median of the newest records: the seconds training
stood still (``RescaleRecord.pause_s``, every applied rescale), and the
seconds new tasks took to start while the job trained on at its old shape
(``launch_s``, of rescales that started tasks). A job's own records count
once it has any; until then those of every job this manager ran; until
there are some, nothing is known and the policy uses its own figure.

The policy weighs a move's time saved against them
(``JobView.rescale_pause_s`` / ``rescale_launch_s``): live, a rescale
stands still for milliseconds, and its new tasks start in seconds while the
job trains on, where a fixed figure must guess.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass

from elasticps.runtime.reports import RescaleRecord

#: Records kept per job, and (times four) over all jobs.
RECENT = 20


@dataclass(frozen=True)
class RescaleCost:
    pause_s: float
    launch_s: float


@dataclass
class _Records:
    pauses: deque[float]
    launches: deque[float]

    @classmethod
    def keeping(cls, n: int) -> _Records:
        return cls(deque(maxlen=n), deque(maxlen=n))

    def add(self, rec: RescaleRecord) -> None:
        self.pauses.append(rec.pause_s)
        if rec.tasks_start_s is not None:
            self.launches.append(rec.tasks_start_s)


class RescaleCosts:
    """``observe`` each record as it comes; ``of(job)`` for the policy's view."""

    def __init__(self, recent: int = RECENT) -> None:
        self._recent = recent
        self._jobs: dict[str, _Records] = {}
        self._all = _Records.keeping(4 * recent)

    def observe(self, job: str, rec: RescaleRecord) -> None:
        """Count an applied rescale (failed ones and releases of tasks are no moves the policy made)."""
        if not rec.ok or rec.reason == "release":
            return
        self._jobs.setdefault(job, _Records.keeping(self._recent)).add(rec)
        self._all.add(rec)

    def forget(self, job: str) -> None:
        """A job ended: its records stay in the all-jobs figures only."""
        self._jobs.pop(job, None)

    def of(self, job: str) -> RescaleCost | None:
        """The job's measured rescale cost (its own records first, then every
        job's); None until some rescale that started tasks was measured."""
        own = self._jobs.get(job)
        pauses = own.pauses if own is not None and own.pauses else self._all.pauses
        launches = own.launches if own is not None and own.launches else self._all.launches
        if not pauses or not launches:
            return None
        return RescaleCost(statistics.median(pauses), statistics.median(launches))

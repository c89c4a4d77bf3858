"""The fleet prior in the manager: a speed model per kind of job, pooled over
the latest observations of every job of that kind, running or ended (what the
simulator's fleet prior is, here from the store).

An ended job's observations no longer change, so they are read once: all of
them when the manager first needs the priors, then each job's as it ends. A
round reads only the active jobs' observations (which it reads for their own
models anyway), however many jobs the store remembers.
"""

from __future__ import annotations

from dataclasses import dataclass

from elasticps.manager.states import ENDED, JobState
from elasticps.manager.store import JobRecord, Store
from elasticps.sched import Observation, SpeedModel
from elasticps.sched.pooling import PRIOR_PER_JOB, PRIOR_TOTAL
from elasticps.sched.speed import fleet_prior


def kind_of(rec: JobRecord) -> tuple:
    """Jobs of one kind share a speed function: same program, batch size, mode
    and task sizes."""
    spec, info = rec.spec, rec.info
    tasks = tuple((t.cpu, t.gpu, t.memory_gb, t.cpu_limit) for t in (spec.ps, spec.workers))
    return (spec.program, info.batch_size if info else None, spec.mode, tasks)


def read_observations(store: Store, name: str) -> list[Observation]:
    """A job's stored speed observations, oldest first."""
    return [Observation(p, w, s, nodes, b, cross) for p, w, s, b, nodes, cross in store.observations(name)]


@dataclass(frozen=True)
class _Tail:
    kind: tuple
    batch: int
    mode: str
    observations: tuple[Observation, ...]


class FleetPriors:
    """Per-kind pooled speed models; ``models(active)`` each round."""

    def __init__(self, store: Store) -> None:
        self.store = store
        # per kind, the ended jobs' tails by job name, in the order they ended,
        # the oldest dropped once the rest hold PRIOR_TOTAL observations
        self._ended: dict[tuple, dict[str, _Tail]] | None = None
        self._active: set[str] = set()  # the active jobs of the last round

    def forget(self, name: str) -> None:
        """A deleted job: its observations no longer count."""
        for tails in (self._ended or {}).values():
            tails.pop(name, None)

    def models(self, active: list[tuple[JobRecord, list[Observation]]]) -> dict[tuple, SpeedModel]:
        """A model per kind: every ended job's latest observations, then those of
        ``active`` (each active job with its observations, this round's read)."""
        if self._ended is None:
            self._ended = {}
            for rec in self.store.list_jobs(tuple(sorted(ENDED))):
                self._remember(rec)
        names = {rec.name for rec, _ in active}
        for name in sorted(self._active - names):  # ended (or deleted) since the last round
            try:
                rec = self.store.get_job(name)
            except KeyError:
                continue
            if JobState(rec.state).ended:
                self._remember(rec)
        self._active = names
        pooled: dict[tuple, list[Observation]] = {}
        batches: dict[tuple, tuple[int, str]] = {}
        tails = [t for kind in self._ended.values() for t in kind.values()]
        tails += [_tail(rec, obs) for rec, obs in active if rec.info is not None]
        for tail in tails:
            pooled.setdefault(tail.kind, []).extend(tail.observations)
            batches[tail.kind] = (tail.batch, tail.mode)
        return {kind: fleet_prior(batches[kind][0], obs, batches[kind][1]) for kind, obs in pooled.items() if obs}

    def _remember(self, rec: JobRecord) -> None:
        assert self._ended is not None
        if rec.info is None:
            return
        tail = _tail(rec, read_observations(self.store, rec.name))
        if not tail.observations:
            return
        tails = self._ended.setdefault(tail.kind, {})
        tails[rec.name] = tail
        held = sum(len(t.observations) for t in tails.values())
        for name in list(tails):  # the oldest first, while the newer ones hold enough without it
            if held - len(tails[name].observations) < PRIOR_TOTAL:
                break
            held -= len(tails.pop(name).observations)


def _tail(rec: JobRecord, observations: list[Observation]) -> _Tail:
    assert rec.info is not None
    return _Tail(kind_of(rec), rec.info.batch_size, rec.spec.mode, tuple(observations[-PRIOR_PER_JOB:]))

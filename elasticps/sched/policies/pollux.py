"""``pollux``: Pollux's scheduler (Qiao et al., "Pollux: Co-adaptive Cluster
Scheduling for Goodput-Optimized Deep Learning", OSDI'21), written from the
paper as a peer baseline. What is implemented and how: docs/pollux.md.

- **Agent** (per job): for an allocation of ``u`` units (a unit is the job's
  smallest task), the configuration with the most goodput that fits in it:
  PS and worker counts within the job's limits, and for an adaptive job the
  batch (:func:`~elasticps.sched.objectives.utility` under ``goodput``:
  samples/s x E(M), E from the gradient noise scale). ``GOODPUT_j(u)``.
- **Speedup** over a fair share: ``SPEEDUP_j(A) = GOODPUT_j(A) / GOODPUT_j(a_f)``,
  a_f an exclusive 1/J share of the available cluster.
- **Re-allocation factor**: a job whose configuration changes (a start
  counts) has its speedup multiplied by ``(T_j - R_j d) / (T_j + d)``, T_j its
  age, R_j its restarts so far, d the restart delay.
- **Fitness**: the power mean of the speedups with p = -1,
  ``(mean_j (SPEEDUP_j + 1e-3)^p)^(1/p)``.
- **Search**: a genetic algorithm over allocation matrices (jobs x nodes, units
  of each job on each node), seeded with the current allocation, the last
  round's population and every job at its minimum packed in order; mutation,
  single-point crossover over jobs, repair, elitist selection
  (:mod:`~elasticps.sched.policies.pollux_search`, which holds each matrix
  sparse: a job on at most a few nodes that can hold it).

Pure: numpy with a seeded generator, no clock; same input, same decision.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from elasticps.errors import ConfigError
from elasticps.sched.objectives import Objective, utility
from elasticps.sched.policies.base import PolicyState, admission_order, admit
from elasticps.sched.policies.pollux_search import Pop, SlotSearch
from elasticps.sched.types import ClusterView, Decision, JobView, Resources, total_of

#: Added to each speedup in the power mean (a job at 0 would make it 0 for p < 0).
SPEEDUP_FLOOR = 1e-3
#: The speedup factor of a move where the job's age is not known (adaptdl's live scheduler's fixed penalty).
UNKNOWN_AGE_FACTOR = 0.9


@dataclass(frozen=True)
class PolluxState(PolicyState):
    """Restarts per job, and the last round's population (job ids, node names, units)."""

    restarts: dict[str, int] = field(default_factory=dict)
    population: tuple[tuple[str, ...], tuple[str, ...], Pop] | None = field(default=None, compare=False)


@dataclass
class _Agents:
    """Per job (rows, in job order): goodput and configuration by units held."""

    goodput: np.ndarray  # (J, W): the best goodput with at most u units, non-decreasing in u
    shape: list[list[tuple[int, int] | None]]  # the configuration reaching it
    change: np.ndarray  # (J, W) bool: that configuration differs from the job's current one
    unit: np.ndarray  # (J, D): a unit's resources
    min_units: np.ndarray  # (J,): units of the job's minimum shape
    max_units: np.ndarray  # (J,)


class PolluxPolicy:
    name = "pollux"

    def __init__(
        self,
        p: float = -1.0,
        rescale_cost_s: float = 30.0,
        population: int = 16,
        generations: int = 20,
        interference_avoidance: bool = True,
        seed: int = 0,
    ) -> None:
        if p == 0 or not math.isfinite(p):
            raise ConfigError(f"pollux: the power mean's p must be finite and not 0, got {p}")
        if population < 2 or generations < 0:
            raise ConfigError(f"pollux: need population >= 2 and generations >= 0, got {population}, {generations}")
        self.p = p
        self.rescale_cost_s = rescale_cost_s
        self.population = population
        self.generations = generations
        self.interference_avoidance = interference_avoidance
        self.seed = seed

    def decide(
        self, jobs: list[JobView], cluster: ClusterView, state: PolicyState | None = None
    ) -> tuple[Decision, PolicyState]:
        prev = state if isinstance(state, PolluxState) else PolluxState()
        order = admission_order(jobs)
        nodes = [n for n in cluster.nodes if n.available.cpu > 0 or n.available.gpu > 0]
        if not order or not nodes:
            return {}, PolluxState(restarts=prev.restarts)
        dims = _dims(order)
        avail = np.array([[_get(n.available, d) for d in dims] for n in nodes], dtype=np.float64)
        agents = _agents(order, dims, avail.sum(0))
        speedup = _Fitness(order, agents, avail.sum(0), prev.restarts, self.rescale_cost_s, self.p)
        rng = np.random.default_rng(self.seed)
        search = SlotSearch(agents.unit, agents.min_units, agents.max_units, avail, rng, self.interference_avoidance)
        job_ids, node_names = [j.id for j in order], [n.name for n in nodes]
        base = search.layout(np.array([_units_of(j, j.current, agents.unit[i], dims) for i, j in enumerate(order)]))
        seeds = [base, search.layout(agents.min_units)]  # now, and every job at its minimum in order
        if prev.population is not None and (last := search.mapped(prev.population, job_ids, node_names)) is not None:
            seeds.insert(1, last)
        pop = search.evolve(Pop.concat(seeds), base, speedup, self.population, self.generations)
        units = search.per_job(pop.take(slice(0, 1)))[0]
        decision: Decision = {}
        restarts = {j.id: prev.restarts.get(j.id, 0) for j in order}
        for i, job in enumerate(order):
            shape = agents.shape[i][units[i]] if units[i] >= agents.min_units[i] else None
            if shape is None:
                continue
            decision[job.id] = shape
            if job.current is not None and shape != job.current:
                restarts[job.id] += 1
        # what the search left out but fits at its minimum starts there (the project's rule
        # for every policy; with p = -1 the search wants it too, given generations enough)
        left = cluster.available - total_of(
            by_id.resources(*decision[i]) for i, by_id in ((j.id, j) for j in order) if i in decision
        )
        extra, _ = admit([j for j in order if j.id not in decision], left)
        decision.update(extra)
        population = (tuple(job_ids), tuple(node_names), pop)
        return decision, PolluxState(restarts=restarts, population=population)


def _dims(jobs: list[JobView]) -> tuple[str, ...]:
    """The resources some job asks for (CPU always)."""
    out = ["cpu"]
    for d in ("gpu", "memory_gb"):
        if any(_get(j.ps_resources, d) or _get(j.worker_resources, d) for j in jobs):
            out.append(d)
    return tuple(out)


def _get(r: Resources, dim: str) -> float:
    return float(getattr(r, dim))


def _unit(job: JobView, dims: tuple[str, ...]) -> np.ndarray:
    """The job's smallest task (by CPUs; a job without PS: its worker)."""
    tasks = [job.worker_resources] + ([job.ps_resources] if job.max_ps > 0 else [])
    small = min(tasks, key=lambda r: (r.cpu, r.gpu, r.memory_gb))
    return np.array([_get(small, d) for d in dims])


def _vector(r: Resources, dims: tuple[str, ...]) -> np.ndarray:
    return np.array([_get(r, d) for d in dims])


def _units(need: np.ndarray, unit: np.ndarray) -> np.ndarray:
    """Units that hold each row of ``need`` (..., D): in every resource, enough units."""
    per = np.where(unit > 0, np.ceil(need / np.where(unit > 0, unit, 1.0) - 1e-9), np.where(need > 0, np.inf, 0.0))
    return np.maximum(per.max(-1), 1.0)


def _units_of(job: JobView, shape: tuple[int, int] | None, unit: np.ndarray, dims: tuple[str, ...]) -> int:
    """Units a shape takes (0: none)."""
    if shape is None:
        return 0
    return int(_units(_vector(job.resources(*shape), dims), unit))


def _agents(jobs: list[JobView], dims: tuple[str, ...], total: np.ndarray) -> _Agents:
    """Each job's agent: its best configuration and goodput for every number of units."""
    units = [_unit(j, dims) for j in jobs]
    cap = [int(np.floor(np.min(np.where(u > 0, total / np.where(u > 0, u, 1), np.inf)) + 1e-9)) for u in units]
    top = [min(c, _units_of(j, (j.max_ps, j.max_workers), u, dims)) for j, u, c in zip(jobs, units, cap, strict=True)]
    width = max(top) + 1
    goodput = np.zeros((len(jobs), width))
    change = np.zeros((len(jobs), width), dtype=bool)
    shapes: list[list[tuple[int, int] | None]] = []
    for i, job in enumerate(jobs):
        grid = [(p, w) for p in range(job.min_ps, job.max_ps + 1) for w in range(job.min_workers, job.max_workers + 1)]
        counts = np.array(grid)
        need = counts[:, :1] * _vector(job.ps_resources, dims) + counts[:, 1:] * _vector(job.worker_resources, dims)
        k = _units(need, units[i])
        g = np.array([utility(job, p, w, Objective.GOODPUT) for p, w in grid])
        at_k = np.zeros(width)
        which = np.full(width, -1)
        for s in np.lexsort((-g, k)):  # by units, best goodput first within each
            if k[s] < width and which[int(k[s])] < 0 and g[s] > 0:
                at_k[int(k[s])], which[int(k[s])] = g[s], s
        running = np.maximum.accumulate(at_k)
        before = np.concatenate([[0.0], running[:-1]])
        last = np.maximum.accumulate(np.where(at_k > before, np.arange(width), -1))
        goodput[i] = running
        row = [grid[which[c]] if c >= 0 else None for c in last]
        shapes.append(row)
        change[i] = [r is not None and r != job.current for r in row]
    min_units = np.array([_units_of(j, (j.min_ps, j.min_workers), u, dims) for j, u in zip(jobs, units, strict=True)])
    return _Agents(goodput, shapes, change, np.array(units), min_units, np.array(top))


class _Fitness:
    """The power mean of the jobs' speedups over a fair share, restarts penalised."""

    def __init__(
        self, jobs: list[JobView], agents: _Agents, total: np.ndarray, restarts: dict[str, int], delay: float, p: float
    ) -> None:
        self.agents, self.p = agents, p
        rows = np.arange(len(jobs))
        fair = np.floor(np.min(total / len(jobs) / np.where(agents.unit > 0, agents.unit, np.inf), axis=1))
        fair = np.clip(np.maximum(fair, agents.min_units), 0, agents.goodput.shape[1] - 1).astype(np.int64)
        base = agents.goodput[rows, fair]
        self.base = np.where(base > 0, base, 1.0)
        ages = [j.age_s for j in jobs]
        self.factor = np.array(
            [
                UNKNOWN_AGE_FACTOR if a is None else max(a - restarts.get(j.id, 0) * delay, 0.0) / (a + delay)
                for j, a in zip(jobs, ages, strict=True)
            ]
        )
        self.rows = rows

    def __call__(self, units: np.ndarray) -> np.ndarray:
        """Fitness of each row of units per job (P, J)."""
        speedup = self.agents.goodput[self.rows, units] / self.base
        speedup = np.where(self.agents.change[self.rows, units], speedup * self.factor, speedup)
        return np.mean((speedup + SPEEDUP_FLOOR) ** self.p, axis=1) ** (1.0 / self.p)

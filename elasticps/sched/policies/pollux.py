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
  round's population and every job at its minimum packed in order; mutation
  (reset a job to its current allocation, zero some of its entries, raise
  entries where the node has room), single-point crossover over jobs, repair
  (at most one distributed job per node, a job's maximum, node capacity in job
  order, at least the job's minimum or nothing),
  elitist selection.

Pure: numpy with a seeded generator, no clock; same input, same decision.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from elasticps.errors import ConfigError
from elasticps.sched.objectives import Objective, utility
from elasticps.sched.policies.base import PolicyState, admission_order, admit
from elasticps.sched.types import ClusterView, Decision, JobView, Resources, total_of

#: Added to each speedup in the power mean (a job at 0 would make it 0 for p < 0).
SPEEDUP_FLOOR = 1e-3
#: The speedup factor of a move where the job's age is not known (adaptdl's live scheduler's fixed penalty).
UNKNOWN_AGE_FACTOR = 0.9


@dataclass(frozen=True)
class PolluxState(PolicyState):
    """Restarts per job, and the last round's population (job ids, node names, units)."""

    restarts: dict[str, int] = field(default_factory=dict)
    population: tuple[tuple[str, ...], tuple[str, ...], np.ndarray] | None = field(default=None, compare=False)


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
        search = _Search(agents, avail, np.random.default_rng(self.seed), self.interference_avoidance)
        base = search.layout(np.array([_units_of(j, j.current, agents.unit[i], dims) for i, j in enumerate(order)]))
        pop = search.seed_population(base, prev.population, [j.id for j in order], [n.name for n in nodes])
        pop = np.concatenate([pop, search.layout(agents.min_units)[None]])  # every job at its minimum, in order
        pop = search.evolve(pop, base, speedup, self.population, self.generations)
        best = pop[int(np.argmax(speedup(pop)))]
        units = np.minimum(best.sum(1), agents.max_units)
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
        population = (tuple(j.id for j in order), tuple(n.name for n in nodes), pop)
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

    def __call__(self, pop: np.ndarray) -> np.ndarray:
        units = np.minimum(pop.sum(2), self.agents.max_units)  # (P, J)
        speedup = self.agents.goodput[self.rows, units] / self.base
        speedup = np.where(self.agents.change[self.rows, units], speedup * self.factor, speedup)
        return np.mean((speedup + SPEEDUP_FLOOR) ** self.p, axis=1) ** (1.0 / self.p)


class _Search:
    """The genetic search over allocation matrices (population x jobs x nodes)."""

    def __init__(self, agents: _Agents, avail: np.ndarray, rng: np.random.Generator, interference: bool) -> None:
        self.agents, self.avail, self.rng, self.interference = agents, avail, rng, interference
        unit = agents.unit[:, None, :]  # (J, 1, D)
        with np.errstate(divide="ignore"):
            per_node = np.where(unit > 0, avail[None, :, :] / np.where(unit > 0, unit, 1), np.inf)
        self.node_cap = np.minimum(np.floor(per_node.min(2) + 1e-9), agents.max_units[:, None]).astype(np.int64)

    def layout(self, units: np.ndarray) -> np.ndarray:
        """The current allocation as a matrix: each running job's units on the
        nodes with most room for it first, in job order (the policy does not
        see placement)."""
        x = np.zeros(self.node_cap.shape, dtype=np.int64)
        free = self.avail.copy()
        for i, want in enumerate(units):
            unit = self.agents.unit[i]
            for n in np.argsort(-self.node_cap[i], kind="stable"):
                if want <= 0:
                    break
                fits = int(np.floor(np.min(free[n][unit > 0] / unit[unit > 0]) + 1e-9))
                take = min(int(want), max(fits, 0))
                x[i, n] += take
                free[n] -= take * unit
                want -= take
        return self.repair(x[None])[0]

    def seed_population(self, base: np.ndarray, prev, job_ids: list[str], node_names: list[str]) -> np.ndarray:
        """The current allocation, and the last round's population mapped onto this round's jobs and nodes."""
        out = [base]
        if prev is not None:
            old_jobs, old_nodes, old = prev
            jpos = {j: k for k, j in enumerate(old_jobs)}
            npos = {n: k for k, n in enumerate(old_nodes)}
            rows = [(i, jpos[j]) for i, j in enumerate(job_ids) if j in jpos]
            cols = [(k, npos[n]) for k, n in enumerate(node_names) if n in npos]
            if rows and cols:
                mapped = np.zeros((len(old), *base.shape), dtype=np.int64)
                ri, ro = (np.array(a) for a in zip(*rows, strict=True))
                ci, co = (np.array(a) for a in zip(*cols, strict=True))
                mapped[:, ri[:, None], ci[None, :]] = old[:, ro[:, None], co[None, :]]
                out.extend(self.repair(mapped))
        return np.stack(out)

    def evolve(self, pop: np.ndarray, base: np.ndarray, fitness, size: int, generations: int) -> np.ndarray:
        while len(pop) < size:  # fill with mutants of what there is
            pop = np.concatenate([pop, self.repair(self.mutate(pop[: size - len(pop)].copy(), base))])
        for _ in range(generations):
            pairs = self.rng.permutation(len(pop))
            a, b = pop[pairs[0::2]], pop[pairs[1::2]][: len(pairs[0::2])]
            a = a[: len(b)]
            children = self.repair(self.mutate(self.crossover(a, b), base))
            pool = np.concatenate([pop, children])
            pop = pool[np.argsort(-fitness(pool), kind="stable")[:size]]
        return pop

    def crossover(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Single point over jobs: the jobs before it from one parent, the rest from the other."""
        jobs = a.shape[1]
        point = self.rng.integers(0, jobs, size=(len(a), 1, 1))
        first = np.arange(jobs)[None, :, None] < point
        return np.concatenate([np.where(first, a, b), np.where(first, b, a)])

    def mutate(self, pop: np.ndarray, base: np.ndarray) -> np.ndarray:
        size, jobs, _ = pop.shape
        reset = self.rng.random((size, jobs, 1)) < 0.1  # a job back to its current allocation
        pop = np.where(reset, base[None], pop)
        some = self.rng.random((size, jobs, 1)) < 0.1  # some of a job's entries zeroed
        pop = np.where(some & (self.rng.random(pop.shape) < 0.1), 0, pop)
        free = self.avail[None] - np.einsum("pjn,jd->pnd", pop, self.agents.unit)  # (P, N, D)
        room = np.all(self.agents.unit[None, :, None, :] <= free[:, None, :, :] + 1e-9, axis=-1)  # (P, J, N)
        p1 = room / np.maximum(room.sum(2, keepdims=True), 1)
        held = room & (pop > 0)
        p2 = held / np.maximum(held.sum(2, keepdims=True), 1)
        grow = self.rng.random(pop.shape) < p1 + p2 - p1 * p2
        high = np.maximum(self.node_cap[None], pop) + 1
        value = self.rng.integers(pop, high)
        return np.where(grow, value, pop)

    def repair(self, pop: np.ndarray) -> np.ndarray:
        pop = pop.copy()
        if self.interference:  # at most one job spread over several nodes on any node
            spread = (np.count_nonzero(pop, axis=2) > 1)[:, :, None] & (pop > 0)
            pop[(np.cumsum(spread, axis=1) > 1) & spread] = 0
        # a job's maximum: units kept node by node in a random order
        perm = self.rng.permutation(pop.shape[2])
        kept = np.minimum(np.cumsum(pop[:, :, perm], axis=2), self.agents.max_units[None, :, None])
        pop[:, :, perm] = np.diff(kept, axis=2, prepend=0)
        # node capacity, earlier jobs first
        unit = self.agents.unit  # (J, D)
        allowed = np.full(pop.shape, np.iinfo(np.int64).max, dtype=np.int64)
        for d in range(unit.shape[1]):
            if not unit[:, d].any():
                continue
            used = np.minimum(np.cumsum(pop * unit[None, :, None, d], axis=1), self.avail[None, None, :, d])
            got = np.diff(used, axis=1, prepend=0)
            with np.errstate(divide="ignore", invalid="ignore"):
                k = np.where(unit[None, :, None, d] > 0, np.floor(got / unit[None, :, None, d] + 1e-9), allowed)
            allowed = np.minimum(allowed, k.astype(np.int64))
        pop = np.minimum(pop, allowed)
        # at least the minimum, or nothing
        pop[pop.sum(2) < self.agents.min_units[None, :]] = 0
        return pop

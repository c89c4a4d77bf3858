"""Pollux's genetic search over allocations, held sparse.

The paper's individual is a jobs x nodes matrix of units. Almost all of it is
zero (a job sits on one node or a few), and a dense population of 32 x 1000 x
256 made every operator a pass over 8 million entries. Here an individual
holds, for each job, :data:`SLOTS` (node, units) pairs: a job on at most that
many nodes, each of them one that can hold a unit of it. The operators are the
paper's, over the same matrix the pairs stand for:

- **mutation**: a job reset to its current allocation (p 0.1); some of a job's
  entries zeroed (p 0.1, each entry 0.1); on each node where there is room,
  about one job raised, to a random value up to what the node holds: each job
  holding the node with p 1 / their number, and each job a unit of which fits
  there with p 1 / their number (the paper's artifact normalises over jobs,
  per node);
- **crossover**: single point over jobs;
- **repair**: at most one job spread over several nodes on any node (the
  first in job order keeps it), a job's maximum (units kept node by node in a
  random order), node capacity with earlier jobs first (per resource, on what
  earlier jobs asked), at least the job's minimum or nothing.

Population arrays: ``node`` and ``units``, both (P, J, K) int64; a slot with
0 units is free (its node means nothing).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

#: Nodes one job may sit on at once in the search.
SLOTS = 8


def rng_binomial(rng: np.random.Generator, count: np.ndarray) -> np.ndarray:
    """How many of ``count`` candidates, each drawn with p 1 / ``count``, are drawn."""
    return rng.binomial(count, 1.0 / np.maximum(count, 1))


Fitness = Callable[[np.ndarray], np.ndarray]  # units per job (P, J) -> fitness (P,)


class Pop(NamedTuple):
    node: np.ndarray  # (P, J, K)
    units: np.ndarray  # (P, J, K)

    def __len__(self) -> int:
        return len(self.units)

    def take(self, index) -> Pop:
        return Pop(self.node[index], self.units[index])

    @staticmethod
    def concat(parts: list[Pop]) -> Pop:
        return Pop(np.concatenate([p.node for p in parts]), np.concatenate([p.units for p in parts]))


def fits_per_node(free: np.ndarray, unit: np.ndarray) -> np.ndarray:
    """Whole units of ``unit`` (D,) that each row of ``free`` (..., D) holds."""
    need = unit > 0
    return np.floor(np.min(free[..., need] / unit[need], axis=-1) + 1e-9).astype(np.int64)


class SlotSearch:
    """The search for one decision: jobs' units ``unit`` (J, D), minimum and
    maximum units (J,), nodes' free resources ``avail`` (N, D)."""

    def __init__(
        self,
        unit: np.ndarray,
        min_units: np.ndarray,
        max_units: np.ndarray,
        avail: np.ndarray,
        rng: np.random.Generator,
        interference: bool,
    ) -> None:
        self.unit, self.min_units, self.max_units = unit, min_units, max_units
        self.avail, self.rng, self.interference = avail, rng, interference
        jobs, nodes = len(unit), len(avail)
        self.slots = min(SLOTS, nodes)
        with np.errstate(divide="ignore"):
            per_node = np.where(unit[:, None, :] > 0, avail[None] / np.where(unit > 0, unit, 1)[:, None, :], np.inf)
        cap = np.minimum(np.floor(per_node.min(2) + 1e-9), max_units[:, None]).astype(np.int64)
        self.node_cap = np.maximum(cap, 0)  # (J, N)
        # each job's candidate nodes (those that hold a unit of it), most room first
        self.order = np.argsort(-self.node_cap, axis=1, kind="stable")
        self.n_cand = (self.node_cap > 0).sum(1)
        # jobs by unit size: sizes (C, D), members (C, most jobs of one size) padded, how many of each
        self.sizes, of = np.unique(unit, axis=0, return_inverse=True)
        of = np.asarray(of).reshape(-1)
        self.members_n = np.bincount(of, minlength=len(self.sizes))
        self.members = np.zeros((len(self.sizes), max(int(self.members_n.max(initial=0)), 1)), dtype=np.int64)
        for c in range(len(self.sizes)):
            got = np.flatnonzero(of == c)
            self.members[c, : len(got)] = got
        self.dims = [d for d in range(unit.shape[1]) if unit[:, d].any()]
        self.jobs, self.nodes = jobs, nodes

    # -- building individuals ------------------------------------------------

    def layout(self, want: np.ndarray) -> Pop:
        """``want[j]`` units of each job on the nodes with most room for it
        first, in job order (the policy does not see placement); repaired."""
        node = np.zeros((1, self.jobs, self.slots), dtype=np.int64)
        units = np.zeros_like(node)
        free = self.avail.copy()
        for j in np.flatnonzero(want > 0):
            order = self.order[j, : self.n_cand[j]]
            fits = np.maximum(fits_per_node(free[order], self.unit[j]), 0)
            before = np.cumsum(fits) - fits
            take = np.clip(want[j] - before, 0, fits)
            used = np.flatnonzero(take)[: self.slots]
            node[0, j, : len(used)] = order[used]
            units[0, j, : len(used)] = take[used]
            free[order[used]] -= take[used, None] * self.unit[j]
        return self.repair(Pop(node, units))

    def mapped(self, prev: tuple, job_ids: list[str], node_names: list[str]) -> Pop | None:
        """The last round's population on this round's jobs and nodes (jobs and
        nodes gone dropped); repaired."""
        old_jobs, old_nodes, old = prev
        jpos = {j: k for k, j in enumerate(old_jobs)}
        npos = {n: k for k, n in enumerate(node_names)}
        rows = [(i, jpos[j]) for i, j in enumerate(job_ids) if j in jpos]
        if not rows or old.node.shape[2] != self.slots:
            return None
        to_new = np.array([npos.get(n, -1) for n in old_nodes], dtype=np.int64)
        ri, ro = (np.array(a) for a in zip(*rows, strict=True))
        node = np.zeros((len(old), self.jobs, self.slots), dtype=np.int64)
        units = np.zeros_like(node)
        node[:, ri] = to_new[old.node[:, ro]]
        units[:, ri] = np.where(node[:, ri] >= 0, old.units[:, ro], 0)
        node = np.maximum(node, 0)
        units = np.where(units > 0, np.minimum(units, self.node_cap[np.arange(self.jobs)[None, :, None], node]), 0)
        return self.repair(Pop(node, units))

    # -- the genetic algorithm -----------------------------------------------

    def evolve(self, pop: Pop, base: Pop, fitness: Fitness, size: int, generations: int) -> Pop:
        """``generations`` rounds of crossover, mutation, repair and elitist
        selection; the population sorted by fitness, best first."""
        while len(pop) < size:  # fill with mutants of what there is
            pop = Pop.concat([pop, self.repair(self.mutate(pop.take(slice(0, size - len(pop))), base))])
        for _ in range(generations):
            pairs = self.rng.permutation(len(pop))
            half = len(pairs) // 2
            a, b = pop.take(pairs[:half]), pop.take(pairs[half : 2 * half])
            children = self.repair(self.mutate(self.crossover(a, b), base))
            pool = Pop.concat([pop, children])
            pop = pool.take(np.argsort(-fitness(self.per_job(pool)), kind="stable")[:size])
        return pop.take(np.argsort(-fitness(self.per_job(pop)), kind="stable"))

    def per_job(self, pop: Pop) -> np.ndarray:
        """Units per job (P, J)."""
        return np.minimum(pop.units.sum(2), self.max_units[None])

    def crossover(self, a: Pop, b: Pop) -> Pop:
        """Single point over jobs: the jobs before it from one parent, the rest from the other."""
        point = self.rng.integers(0, self.jobs, size=(len(a), 1, 1))
        first = np.arange(self.jobs)[None, :, None] < point
        return Pop(
            np.concatenate([np.where(first, a.node, b.node), np.where(first, b.node, a.node)]),
            np.concatenate([np.where(first, a.units, b.units), np.where(first, b.units, a.units)]),
        )

    def free(self, pop: Pop) -> np.ndarray:
        """What each individual leaves free on each node (P, N, D)."""
        size = len(pop)
        flat = (np.arange(size)[:, None, None] * self.nodes + pop.node).ravel()
        out = np.repeat(self.avail[None], size, axis=0)
        for d in self.dims:
            weights = (pop.units * self.unit[None, :, None, d]).ravel()
            used = np.bincount(flat, weights=weights, minlength=size * self.nodes)
            out[:, :, d] -= used.reshape(size, self.nodes)
        return out

    def mutate(self, pop: Pop, base: Pop) -> Pop:
        size, jobs, _ = pop.units.shape
        rng = self.rng
        reset = rng.random((size, jobs, 1)) < 0.1  # a job back to its current allocation
        node = np.where(reset, base.node, pop.node)
        units = np.where(reset, base.units, pop.units)
        some = rng.random((size, jobs, 1)) < 0.1  # some of a job's entries zeroed
        units = np.where(some & (rng.random(units.shape) < 0.1), 0, units)
        free = self.free(Pop(node, units))  # (P, N, D)
        prow = np.arange(size)[:, None, None]
        # on each node with room, about one of the jobs holding it is raised (p 1 / their number) ...
        room = np.all(free[prow, node] + 1e-9 >= self.unit[None, :, None, :], axis=-1)
        held = (units > 0) & room
        flat = (prow * self.nodes + node)[held]
        holders = np.bincount(flat, minlength=size * self.nodes)
        raise_held = np.zeros(units.shape, dtype=bool)
        raise_held[held] = rng.random(len(flat)) * holders[flat] < 1.0
        # ... and about one of all the jobs a unit of which fits there (p 1 / their number)
        p_i, j_i, n_i = self._one_job_per_node(free)
        at = (node[p_i, j_i] == n_i[:, None]) & (units[p_i, j_i] > 0)  # (E, K): the job holds it already
        has = at.any(1)
        raise_held[p_i[has], j_i[has], np.argmax(at[has], axis=1)] = True
        cap = self.node_cap[np.arange(jobs)[None, :, None], node]
        grow = np.where(raise_held, rng.integers(units, np.maximum(cap, units) + 1), units)
        # a node the job does not hold: into a free slot (one a job per child), a random value up to what it holds
        p_i, j_i, n_i = p_i[~has], j_i[~has], n_i[~has]
        _, first = np.unique(p_i * jobs + j_i, return_index=True)
        p_i, j_i, n_i = p_i[first], j_i[first], n_i[first]
        open_ = units[p_i, j_i] == 0
        keep = open_.any(1)
        p_i, j_i, n_i, k_i = p_i[keep], j_i[keep], n_i[keep], np.argmax(open_[keep], axis=1)
        node = node.copy()
        node[p_i, j_i, k_i] = n_i
        grow[p_i, j_i, k_i] = rng.integers(0, self.node_cap[j_i, n_i] + 1)
        return Pop(node, grow)

    def _one_job_per_node(self, free: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per individual and node, each job a unit of which fits in what is free
        there drawn with p 1 / their number: (individual, job, node) of each draw.
        Jobs are counted by unit size (few sizes), not one by one."""
        fit = np.all(self.sizes[None, :, None, :] <= free[:, None, :, :] + 1e-9, axis=-1)  # (P, C, N)
        weight = fit * self.members_n[None, :, None]
        count = weight.sum(1)  # (P, N)
        draws = rng_binomial(self.rng, count)
        p_i, n_i = np.nonzero(draws)
        reps = draws[p_i, n_i]
        p_i, n_i = np.repeat(p_i, reps), np.repeat(n_i, reps)
        cum = np.cumsum(weight[p_i, :, n_i], axis=1)  # (E, C)
        pick = self.rng.random(len(p_i)) * count[p_i, n_i]
        c_i = np.minimum((cum <= pick[:, None]).sum(1), len(self.sizes) - 1)
        j_i = self.members[c_i, (self.rng.random(len(p_i)) * self.members_n[c_i]).astype(np.int64)]
        ok = self.node_cap[j_i, n_i] > 0
        return p_i[ok], j_i[ok], n_i[ok]

    def repair(self, pop: Pop) -> Pop:
        node, units = pop.node, pop.units.copy()
        if self.interference:  # at most one job spread over several nodes on any node: the first keeps it
            spread = ((units > 0).sum(2) > 1)[:, :, None] & (units > 0)
            p_i, j_i, k_i = np.nonzero(spread)  # in (p, j) order
            key = p_i * self.nodes + node[p_i, j_i, k_i]
            by = np.argsort(key, kind="stable")
            later = np.ones(len(by), dtype=bool)
            later[0:1] = False
            later[1:] = key[by][1:] == key[by][:-1]
            units[p_i[by][later], j_i[by][later], k_i[by][later]] = 0
        # a job's maximum: units kept node by node in a random order
        rank = self.rng.permutation(self.nodes)[node]
        order = np.argsort(rank, axis=2, kind="stable")
        kept = np.minimum(np.cumsum(np.take_along_axis(units, order, 2), axis=2), self.max_units[None, :, None])
        np.put_along_axis(units, order, np.diff(kept, axis=2, prepend=0), 2)
        # node capacity, earlier jobs first (on what they asked, per resource)
        p_i, j_i, k_i = np.nonzero(units > 0)
        if len(p_i):
            key = p_i * self.nodes + node[p_i, j_i, k_i]
            by = np.argsort(key, kind="stable")  # by node, jobs in order within each
            p_i, j_i, k_i, key = p_i[by], j_i[by], k_i[by], key[by]
            asked = units[p_i, j_i, k_i]
            start = np.ones(len(key), dtype=bool)
            start[1:] = key[1:] != key[:-1]
            first = np.maximum.accumulate(np.where(start, np.arange(len(key)), 0))
            n_i = key % self.nodes
            allowed = asked.copy()
            for d in self.dims:
                per = self.unit[j_i, d]
                demand = asked * per
                total = np.cumsum(demand)
                before = total - demand
                used = np.minimum(total - before[first], self.avail[n_i, d])
                prev = np.where(start, 0.0, np.minimum(before - before[first], self.avail[n_i, d]))
                with np.errstate(divide="ignore", invalid="ignore"):
                    k = np.where(per > 0, np.floor((used - prev) / np.where(per > 0, per, 1) + 1e-9), asked)
                allowed = np.minimum(allowed, k.astype(np.int64))
            units[p_i, j_i, k_i] = np.maximum(allowed, 0)
        # at least the minimum, or nothing
        units[units.sum(2) < self.min_units[None, :]] = 0
        return Pop(node, units)

"""A lower bound on a workload's job completion times, from its ground truth.

A yardstick no policy wrote: no schedule on the modelled cluster can do
better, whatever it knows. Two bounds, each valid on its own; the larger of
their averages is ``lower_bound_s``:

1. **Per job** (``per_job_avg_jct_s``): each job alone on the empty cluster
   from the moment it arrives, at its best shape within its limits (any shape
   that fits in the whole cluster), placed to cross nodes as little as node
   capacity allows, at its best batch (adaptive jobs), with no pause and no
   wait for a decision. Its time is its work over that speed.
2. **Fluid** (``fluid_avg_jct_s``): the cluster as one machine. A job's work
   needs at least its least resource-seconds (the work over the most samples
   per resource-second of any shape and batch); at any moment the jobs hold at
   most the cluster's capacity. So the jobs' completion times are at least
   those of one machine of that capacity processing each job's least
   resource-seconds, preemptively, from its arrival; shortest remaining first
   (SRPT) minimises their sum there. Worked out per resource (CPU, GPU,
   memory), the largest taken. It means something where the cluster is
   contended; on an idle one the per-job bound is the larger.

Both use the run's ground truth (:mod:`elasticps.sim.truth`), each job at
its own surface; a job whose surface pays for shards sharing a node
(``saturation``) is judged with each shard on a node of its own (the
fastest it could be). Both ignore other tenants (they only take room away), so the bound is lower
than it could be where tenants hold much (by up to their mean share of the
CPUs, 12.5% by default, on a cluster that is busy all the time).
``makespan_s``: the last job's arrival plus its per-job time, or the fluid
machine's finish, whichever is later.

An adaptive job's goodput grows as its noise scale does, so its work is cut
into :data:`SEGMENTS` pieces, each run at its best rate for the noise scale at
the piece's end (an over-estimate: the bound stays a bound).
"""

from __future__ import annotations

import functools
import heapq
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, replace

from elasticps.sched.goodput import batch_candidates, statistical_efficiency
from elasticps.sched.synthetic import ModelKind
from elasticps.sched.types import Resources
from elasticps.sim.truth import OPTIMUS_TRUTH, Truth
from elasticps.sim.workload import KINDS, WorkloadJob, noise_scale_at

#: Pieces an adaptive job's work is cut into (its noise scale at each piece's end).
SEGMENTS = 32


@dataclass(frozen=True)
class LowerBound:
    per_job_s: tuple[float, ...]  # each job's per-job bound on its JCT, in workload order
    per_job_avg_jct_s: float
    fluid_avg_jct_s: float
    fluid_resource: str  # the resource whose fluid bound is the largest
    makespan_s: float

    @property
    def avg_jct_s(self) -> float:
        return max(self.per_job_avg_jct_s, self.fluid_avg_jct_s)

    @property
    def binding(self) -> str:
        """Which bound is the larger: ``per_job`` or ``fluid_<resource>``."""
        return "per_job" if self.per_job_avg_jct_s >= self.fluid_avg_jct_s else f"fluid_{self.fluid_resource}"

    def to_dict(self) -> dict[str, float | str]:
        return {
            "avg_jct_s": self.avg_jct_s,
            "per_job_avg_jct_s": self.per_job_avg_jct_s,
            "fluid_avg_jct_s": self.fluid_avg_jct_s,
            "binding": self.binding,
            "makespan_s": self.makespan_s,
        }


def lower_bound(
    workload: list[WorkloadJob],
    nodes: int,
    node: Resources,
    local_factor: float,
    speed_factor: Callable[[WorkloadJob], float] = lambda spec: 1.0,
    truth: Truth = OPTIMUS_TRUTH,
) -> LowerBound:
    """The bounds above for ``workload`` on ``nodes`` nodes of capacity ``node``;
    ``speed_factor(job)``: a job's true speed against its kind's; ``truth``:
    the speed surfaces (each job's own)."""
    total = node.scaled(nodes)
    alone: list[float] = []
    need: dict[str, list[float]] = {"cpu": [], "gpu": [], "memory": []}
    for spec in workload:
        factor = speed_factor(spec)
        pieces = _pieces(spec)
        surface = truth.surface(spec.id, KINDS[spec.kind])
        seconds, area = 0.0, dict.fromkeys(need, 0.0)
        for share, noise in pieces:
            work = share * spec.samples
            best, least = _best_rates(_profile(spec), node, total, local_factor, noise, truth, surface)
            seconds += work / (factor * best)
            for r in need:
                area[r] += work * least[r] / factor
        alone.append(seconds)
        for r in need:
            need[r].append(area[r])
    arrivals = [spec.arrival_s for spec in workload]
    capacity = {"cpu": total.cpu, "gpu": total.gpu, "memory": total.memory_gb}
    fluid, finish = {}, 0.0
    for r, areas in need.items():
        if capacity[r] <= 0 or not any(areas):
            continue
        done = srpt_completions(arrivals, [a / capacity[r] for a in areas])
        fluid[r] = statistics.fmean(c - a for c, a in zip(done, arrivals, strict=True))
        finish = max(finish, max(done))
    resource = max(fluid, key=lambda r: fluid[r]) if fluid else "cpu"
    return LowerBound(
        per_job_s=tuple(alone),
        per_job_avg_jct_s=statistics.fmean(alone) if alone else math.nan,
        fluid_avg_jct_s=fluid.get(resource, 0.0),
        fluid_resource=resource,
        makespan_s=max([finish, *(a + s for a, s in zip(arrivals, alone, strict=True))]),
    )


def srpt_completions(arrivals: list[float], sizes: list[float]) -> list[float]:
    """Completion times on one machine running the job with the shortest
    remaining size first, preemptively, each from its arrival (optimal for
    the sum of completion times; Schrage, 1968)."""
    order = sorted(range(len(arrivals)), key=lambda i: arrivals[i])
    done = [0.0] * len(arrivals)
    queue: list[tuple[float, int]] = []
    t, k = 0.0, 0
    while k < len(order) or queue:
        if not queue:
            t = max(t, arrivals[order[k]])
        while k < len(order) and arrivals[order[k]] <= t:
            heapq.heappush(queue, (sizes[order[k]], order[k]))
            k += 1
        left, i = heapq.heappop(queue)
        until = arrivals[order[k]] if k < len(order) else math.inf
        if t + left <= until:
            t += left
            done[i] = t
        else:
            heapq.heappush(queue, (left - (until - t), i))
            t = until
    return done


def _pieces(spec: WorkloadJob) -> list[tuple[float, float | None]]:
    """(share of the work, noise scale to judge it at): one piece for a fixed batch."""
    if not spec.max_batch or spec.noise_scale <= 0:
        return [(1.0, None)]
    return [(1.0 / SEGMENTS, noise_scale_at(spec, (k + 1) / SEGMENTS)) for k in range(SEGMENTS)]


def _profile(spec: WorkloadJob) -> WorkloadJob:
    """What of a job its best rates depend on (jobs alike share them)."""
    return replace(spec, id="", arrival_s=0.0, samples=1.0, static_ps=spec.min_ps, static_workers=spec.min_workers)


@functools.lru_cache(maxsize=4096)
def _best_rates(
    spec: WorkloadJob,
    node: Resources,
    total: Resources,
    local_factor: float,
    noise: float | None,
    truth: Truth = OPTIMUS_TRUTH,
    surface: str = OPTIMUS_TRUTH.name,
) -> tuple[float, dict[str, float]]:
    """The job's best progress rate (samples at the kind's batch per second, at
    its kind's speed) over shapes and batches, and per resource the least of
    that resource held per unit of progress."""
    kind = KINDS[spec.kind]
    ps = Resources(cpu=spec.ps_cpu, memory_gb=spec.ps_memory_gb)
    worker = Resources(cpu=spec.worker_cpu, gpu=spec.worker_gpu, memory_gb=spec.worker_memory_gb)
    batches = batch_candidates(kind.batch, spec.max_batch) or (kind.batch,)
    best, least = 0.0, {"cpu": math.inf, "gpu": math.inf, "memory": math.inf}
    for p in range(spec.min_ps, spec.max_ps + 1):
        for w in range(spec.min_workers, spec.max_workers + 1):
            held = ps.scaled(p) + worker.scaled(w)
            if not held.fits_in(total):
                continue
            cross = _least_cross(kind, ps, worker, node, p, w)
            if cross is None:
                continue
            rate = max(
                truth.speed(surface, kind, p, w, cross, local_factor, m) * statistical_efficiency(m, noise, kind.batch)
                for m in batches
            )
            if rate <= 0:
                continue
            best = max(best, rate)
            for r, amount in (("cpu", held.cpu), ("gpu", held.gpu), ("memory", held.memory_gb)):
                least[r] = min(least[r], amount / rate)
    return best, {r: (v if math.isfinite(v) else 0.0) for r, v in least.items()}


def _least_cross(kind: ModelKind, ps: Resources, worker: Resources, node: Resources, p: int, w: int) -> float | None:
    """The least share of the job's traffic that must cross nodes (None: a task
    fits on no node). All-reduce: 0 on one node, else any share is the slow ring."""
    pairs = _most_local_pairs(ps, worker, node, p, w)
    if pairs is None:
        return None
    if kind.allreduce:
        return 0.0 if worker.scaled(w).fits_in(node) else 1.0
    return 1.0 - pairs / (p * w)


@functools.lru_cache(maxsize=4096)
def _most_local_pairs(ps: Resources, worker: Resources, node: Resources, p: int, w: int) -> int | None:
    """The most (PS, worker) pairs that can share a node when ``p`` PS and ``w``
    workers are put on nodes of capacity ``node`` (max of sum over nodes of
    p_n * w_n; traffic crosses for the rest): exact, by recursion over one
    node's load at a time. None: a single task does not fit on a node."""
    if (p and not ps.fits_in(node)) or (w and not worker.fits_in(node)):
        return None
    if p == 0 or w == 0:
        return 0
    best = 0
    for a in range(p + 1):
        for b in range(w + 1):
            if (a, b) == (0, 0) or not (ps.scaled(a) + worker.scaled(b)).fits_in(node):
                continue
            rest = _most_local_pairs(ps, worker, node, p - a, w - b)
            best = max(best, a * b + (rest or 0))
    return best

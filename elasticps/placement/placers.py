"""The placers: each puts one job's tasks at a shape on the nodes with room,
all or nothing (``None``: they do not fit).

- ``locality`` (the project's): one node if the job fits on one (best fit, to
  keep large holes for large jobs); else the fewest nodes, fullest first, with
  PS shards in proportion to the workers on each node.
- ``spread``: every task on the node with the most room left (like Ray's SPREAD).
- ``pack``: every task on the first node with room (first fit).
- ``optimus``: the fewest nodes that take an equal number of PS and workers each.

How a round uses them (kept jobs, resized ones around their tasks,
compaction) is :mod:`elasticps.placement.place`.
"""

from __future__ import annotations

from collections.abc import Callable

from elasticps.placement.room import Room, dominant
from elasticps.placement.traffic import JobPlacement
from elasticps.sched.types import JobView, Resources

PLACERS: dict[str, str] = {
    "locality": "fewest nodes, PS in proportion to workers (default)",
    "spread": "each task on the node with the most room (like Ray's SPREAD)",
    "pack": "first fit",
    "optimus": "fewest nodes with equal PS and workers per node",
}


def _names(p: int, w: int) -> tuple[list[str], list[str]]:
    return [f"ps-{i}" for i in range(p)], [f"worker-{i}" for i in range(w)]


def _place_each(
    job: JobView, p: int, w: int, room: Room, choose: Callable[[Resources], str | None]
) -> JobPlacement | None:
    """Place task by task with ``choose(resources) -> node``; roll back on failure."""
    ps_names, w_names = _names(p, w)
    out: JobPlacement = {}
    taken: list[tuple[str, Resources]] = []
    for name, r in [(n, job.ps_resources) for n in ps_names] + [(n, job.worker_resources) for n in w_names]:
        node = choose(r)
        if node is None or not room.take(node, r):
            room.give_all(taken)
            return None
        taken.append((node, r))
        out[name] = node
    return out


def _spread(job: JobView, p: int, w: int, room: Room) -> JobPlacement | None:
    def choose(r: Resources) -> str | None:
        fits = [n for n in room.order if r.fits_in(room.free[n])]
        return max(fits, key=lambda n: (room.free[n].cpu, room.free[n].memory_gb, -room.rank[n])) if fits else None

    return _place_each(job, p, w, room, choose)


def _pack(job: JobView, p: int, w: int, room: Room) -> JobPlacement | None:
    def choose(r: Resources) -> str | None:
        return next((n for n in room.order if r.fits_in(room.free[n])), None)

    return _place_each(job, p, w, room, choose)


def _assign(job: JobView, plan: list[tuple[str, int, int]], room: Room) -> JobPlacement | None:
    """Take room for ``plan`` = [(node, #ps, #workers)]; all or nothing."""
    if not room.take_all([(node, job.resources(np_, nw)) for node, np_, nw in plan]):
        return None
    out: JobPlacement = {}
    pi = wi = 0
    for node, np_, nw in plan:
        for _ in range(np_):
            out[f"ps-{pi}"] = node
            pi += 1
        for _ in range(nw):
            out[f"worker-{wi}"] = node
            wi += 1
    return out


def _optimus(job: JobView, p: int, w: int, room: Room) -> JobPlacement | None:
    for k in range(1, len(room.order) + 1):
        per_ps, per_w = -(-p // k), -(-w // k)
        nodes = [n for n in room.order if job.resources(min(per_ps, p), min(per_w, w)).fits_in(room.free[n])]
        nodes.sort(key=lambda n: (-room.free[n].cpu, room.rank[n]))
        if len(nodes) < k:
            continue
        plan, left_p, left_w = [], p, w
        for n in nodes[:k]:
            a, b = min(per_ps, left_p), min(per_w, left_w)
            plan.append((n, a, b))
            left_p, left_w = left_p - a, left_w - b
        if left_p == 0 and left_w == 0:
            return _assign(job, plan, room)
    return None


def locality(job: JobView, p: int, w: int, room: Room, prefer: set[str]) -> JobPlacement | None:
    need = job.resources(p, w)
    amount = dominant(job)
    # 1. one node: best fit (least of the dominant resource left over, so the least free: the need is the same
    # on each), preferring where the job already runs
    whole = [n for n in room.order if need.fits_in(room.free[n])]
    if whole:
        best = min(whole, key=lambda n: (n not in prefer, amount(room.free[n]), room.rank[n]))
        return _assign(job, [(best, p, w)], room)
    # 2. the fewest nodes: fill the roomiest first with workers, then shards in proportion
    unit = job.worker_resources + job.ps_resources.scaled(p / max(w, 1))  # a worker and its share of PS
    nodes = sorted(
        room.order,
        key=lambda n: (n not in prefer, -room.count_fit(n, unit), -amount(room.free[n]), room.rank[n]),
    )
    plan_w: list[tuple[str, int]] = []
    left = w
    for n in nodes:
        if left == 0:
            break
        k = min(left, room.count_fit(n, unit))
        if k > 0:
            plan_w.append((n, k))
            left -= k
    if left > 0:
        return _pack(job, p, w, room)  # too tight for the proportional plan: first fit, or nothing
    # largest remainder apportionment of P shards over the workers' nodes
    quotas = [(n, k * p / w) for n, k in plan_w]
    shards = {n: int(q) for n, q in quotas}
    for n, _ in sorted(quotas, key=lambda t: (-(t[1] - int(t[1])), nodes.index(t[0])))[: p - sum(shards.values())]:
        shards[n] += 1
    placed = _assign(job, [(n, shards[n], k) for n, k in plan_w], room)
    return placed if placed is not None else _pack(job, p, w, room)


def place_one(job: JobView, p: int, w: int, room: Room, prefer: set[str], method: str) -> JobPlacement | None:
    """``job``'s tasks at (p, w) on nodes with room, by ``method`` (None: they do not fit)."""
    if method == "locality":
        return locality(job, p, w, room, prefer)
    return {"spread": _spread, "pack": _pack, "optimus": _optimus}[method](job, p, w, room)

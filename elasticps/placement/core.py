"""Placing a job's PS and worker tasks on nodes.

Traffic model (one for the simulator and the live metrics): every step each
worker pulls its slice of the parameters from every PS shard and pushes a
gradient of the same size back. For a job with S bytes of parameters and P
shards, a (worker, shard) pair moves 2*S/P bytes a step; it crosses the
network when the two sit on different nodes:

    cross_bytes_per_step = sum over pairs on different nodes of 2*S/P
                         = 2*S*W * (1 - sum_n (w_n/W) * (p_n/P))

so cross traffic is least when the job sits on few nodes and its shards are
spread in proportion to where its workers are.

Placers (same protocol, ``placer(jobs, decision, cluster, current) -> PlacementResult``):
- ``locality`` (the project's): one node if the job fits on one (best fit, to
  keep large holes for large jobs); else the fewest nodes, fullest first, with
  PS shards in proportion to the workers on each node. A running job whose
  shape did not change stays where it is; one whose shape changed keeps its
  tasks where they run and adds or drops tasks around them (a moved task
  needs room before its old one is released). Either is moved onto fewer
  nodes if it spans more than the room left would need (compaction).
- ``spread``: every task on the node with the most room left (like Ray's SPREAD).
- ``pack``: every task on the first node with room (first fit).
- ``optimus``: the fewest nodes that take an equal number of PS and workers each.

A job is placed whole or reported unplaceable, never half-placed.

Why one long module: the four placers share one room ledger (``_Room``) and
the order a round places in (kept jobs, then resized, then new, then
compaction): cut apart, each piece would need the whole ledger and order.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from elasticps.errors import ConfigError
from elasticps.sched.types import ClusterView, Decision, JobView, Resources, tasks_of

#: ``{task name ("ps-0", "worker-3"): node name}``
JobPlacement = dict[str, str]


@dataclass
class PlacementResult:
    placement: dict[str, JobPlacement] = field(default_factory=dict)
    unplaceable: list[str] = field(default_factory=list)
    moves: int = 0  # running tasks that changed node
    kept: list[str] = field(default_factory=list)  # running jobs whose new shape did not fit: at their old one

    @property
    def shapes(self) -> dict[str, tuple[int, int]]:
        """The shape each placed job runs at: the decision's, or its old one (``kept``)."""
        return {job_id: _shape_of(placed) for job_id, placed in self.placement.items()}


def cross_node_bytes_per_step(placement: JobPlacement, param_bytes: float) -> float:
    ps = [n for t, n in placement.items() if t.startswith("ps-")]
    workers = [n for t, n in placement.items() if t.startswith("worker-")]
    if not ps:
        return 0.0
    per_pair = 2.0 * param_bytes / len(ps)
    return sum(per_pair for w in workers for p in ps if w != p)


def cross_share(placement: JobPlacement, param_bytes: float, w: int) -> float:
    """The share of a PS job's traffic that crosses nodes as placed (1 with no
    placement): what its speed depends on, and what its reports carry."""
    return cross_node_bytes_per_step(placement, param_bytes) / (2.0 * param_bytes * w) if placement else 1.0


class _Room:
    """Free resources per node while placing (tentative, with rollback)."""

    def __init__(self, cluster: ClusterView) -> None:
        self.order = [n.name for n in cluster.nodes]
        self.free = {n.name: n.available for n in cluster.nodes}

    def take(self, node: str, r: Resources) -> bool:
        if r.fits_in(self.free[node]):
            self.free[node] = self.free[node] - r
            return True
        return False

    def give(self, node: str, r: Resources) -> None:
        self.free[node] = self.free[node] + r

    def take_all(self, items: list[tuple[str, Resources]]) -> bool:
        """Take every ``(node, resources)``, or nothing (a node not here has no room)."""
        for k, (node, r) in enumerate(items):
            if node not in self.free or not self.take(node, r):
                self.give_all(items[:k])
                return False
        return True

    def give_all(self, items: list[tuple[str, Resources]]) -> None:
        for node, r in items:
            self.give(node, r)

    def count_fit(self, node: str, r: Resources) -> int:
        """How many of ``r`` fit on ``node`` now."""
        return _count_fit(self.free[node], r)


def _count_fit(free: Resources, r: Resources) -> int:
    counts = [
        int((a + 1e-9) // b) for a, b in ((free.cpu, r.cpu), (free.gpu, r.gpu), (free.memory_gb, r.memory_gb)) if b > 0
    ]
    return min(counts) if counts else 1 << 30


def task_resources(job: JobView, task: str) -> Resources:
    return job.ps_resources if task.startswith("ps-") else job.worker_resources


def room_left(jobs: list[JobView], cluster: ClusterView, placement: dict[str, JobPlacement]) -> dict[str, Resources]:
    """Per node, what is free once every task of ``placement`` is on it."""
    by_id = {j.id: j for j in jobs}
    free = {n.name: n.available for n in cluster.nodes}
    for job_id, where in placement.items():
        for task, node in where.items():
            free[node] = free[node] - task_resources(by_id[job_id], task)
    return free


def with_own_room(job: JobView, where: JobPlacement, free: dict[str, Resources]) -> dict[str, Resources]:
    """``free`` (e.g. :func:`room_left`) with what ``job``'s tasks at ``where`` hold given back."""
    out = dict(free)
    for task, node in where.items():
        out[node] = out[node] + task_resources(job, task)
    return out


def _names(p: int, w: int) -> tuple[list[str], list[str]]:
    return [f"ps-{i}" for i in range(p)], [f"worker-{i}" for i in range(w)]


def _place_each(
    job: JobView, p: int, w: int, room: _Room, choose: Callable[[Resources], str | None]
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


def _spread(job: JobView, p: int, w: int, room: _Room) -> JobPlacement | None:
    def choose(r: Resources) -> str | None:
        fits = [n for n in room.order if r.fits_in(room.free[n])]
        return (
            max(fits, key=lambda n: (room.free[n].cpu, room.free[n].memory_gb, -room.order.index(n))) if fits else None
        )

    return _place_each(job, p, w, room, choose)


def _pack(job: JobView, p: int, w: int, room: _Room) -> JobPlacement | None:
    def choose(r: Resources) -> str | None:
        return next((n for n in room.order if r.fits_in(room.free[n])), None)

    return _place_each(job, p, w, room, choose)


def _assign(job: JobView, plan: list[tuple[str, int, int]], room: _Room) -> JobPlacement | None:
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


def _optimus(job: JobView, p: int, w: int, room: _Room) -> JobPlacement | None:
    for k in range(1, len(room.order) + 1):
        per_ps, per_w = -(-p // k), -(-w // k)
        nodes = [n for n in room.order if job.resources(min(per_ps, p), min(per_w, w)).fits_in(room.free[n])]
        nodes.sort(key=lambda n: (-room.free[n].cpu, room.order.index(n)))
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


def dominant(job: JobView) -> Callable[[Resources], float]:
    """The resource a job's placement is judged by: GPUs for a job whose tasks
    use them (they are the scarce ones), else CPUs."""
    if job.worker_resources.gpu > 0 or job.ps_resources.gpu > 0:
        return lambda r: r.gpu
    return lambda r: r.cpu


def fewest_nodes(job: JobView, p: int, w: int, free: dict[str, Resources]) -> int | None:
    """The fewest nodes of ``free`` that hold the shape, counting a worker with
    its share of the PS shards as one unit (``None``: it does not fit at all).
    Exact for jobs without PS (identical units: the roomiest nodes first is
    optimal); for PS jobs it is the count the proportional plan aims for."""
    return _fewest(job.ps_resources, job.worker_resources, p, w, list(free.values()))


def spans_on(ps: Resources, worker: Resources, room: list[Resources]) -> Callable[[int, int], int]:
    """How many nodes a shape's tasks would span placed on nodes with this
    ``room``: the fewest that hold it, as placement aims for (all of them for a
    shape they cannot hold: it would not be placed). What a speed model
    predicts a shape's speed for (:class:`elasticps.sched.SpeedModel`'s ``span``)."""
    memo: dict[tuple[int, int], int] = {}

    def span(p: int, w: int) -> int:
        if (p, w) not in memo:
            memo[(p, w)] = _fewest(ps, worker, p, w, room) or max(1, len(room))
        return memo[(p, w)]

    return span


def _fewest(ps: Resources, worker: Resources, p: int, w: int, free: list[Resources]) -> int | None:
    if w == 0:
        return 1 if any(tasks_of(ps, worker, p, 0).fits_in(f) for f in free) else None
    unit = worker + ps.scaled(p / w)
    counts = sorted((_count_fit(f, unit) for f in free), reverse=True)
    left = w
    for used, k in enumerate(counts, start=1):
        left -= k
        if left <= 0:
            return used
    return None


def _locality(job: JobView, p: int, w: int, room: _Room, prefer: set[str]) -> JobPlacement | None:
    need = job.resources(p, w)
    amount = dominant(job)
    # 1. one node: best fit (least of the dominant resource left over), preferring where the job already runs
    whole = [n for n in room.order if need.fits_in(room.free[n])]
    if whole:
        best = min(whole, key=lambda n: (n not in prefer, amount(room.free[n] - need), room.order.index(n)))
        return _assign(job, [(best, p, w)], room)
    # 2. the fewest nodes: fill the roomiest first with workers, then shards in proportion
    unit = job.worker_resources + job.ps_resources.scaled(p / max(w, 1))  # a worker and its share of PS
    nodes = sorted(
        room.order,
        key=lambda n: (n not in prefer, -room.count_fit(n, unit), -amount(room.free[n]), room.order.index(n)),
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


PLACERS: dict[str, str] = {
    "locality": "fewest nodes, PS in proportion to workers (default)",
    "spread": "each task on the node with the most room (like Ray's SPREAD)",
    "pack": "first fit",
    "optimus": "fewest nodes with equal PS and workers per node",
}


def make_placer(name: str) -> Callable[..., PlacementResult]:
    if name not in PLACERS:
        raise ConfigError(f"placement must be one of {sorted(PLACERS)}, got {name!r}")

    def placer(
        jobs: list[JobView], decision: Decision, cluster: ClusterView, current: dict[str, JobPlacement] | None = None
    ) -> PlacementResult:
        return place(jobs, decision, cluster, current, name)

    return placer


def place(
    jobs: list[JobView],
    decision: Decision,
    cluster: ClusterView,
    current: dict[str, JobPlacement] | None = None,
    method: str = "locality",
) -> PlacementResult:
    """A node for every task of every job in ``decision``.

    Jobs whose shape did not change keep their current nodes when those still
    have room (no move); the others are placed, biggest first. ``cluster``'s
    ``available`` must exclude only other tenants: the jobs' own tasks are placed
    from scratch here.
    """
    if method not in PLACERS:
        raise ConfigError(f"placement must be one of {sorted(PLACERS)}, got {method!r}")
    current = current or {}
    by_id = {j.id: j for j in jobs}
    room = _Room(cluster)
    result = PlacementResult()
    todo = []
    for job_id in sorted(decision):
        job = by_id[job_id]
        p, w = decision[job_id]
        old = current.get(job_id)
        if old is not None and _shape_of(old) == (p, w) and _keep(job, old, room):
            result.placement[job_id] = dict(old)
            continue
        todo.append(job)
    biggest = _biggest_first(decision, cluster)
    todo.sort(key=lambda j: (j.id not in current, *biggest(j)))  # running jobs first: a start can wait
    for job in todo:
        p, w = decision[job.id]
        placed = None
        if method == "locality" and job.id in current:  # resized: its tasks stay where they run
            kept = _hold_kept(job, p, w, current[job.id], room)
            placed = _add_around(job, p, w, kept, room) if kept is not None else None
        if placed is None:
            placed = _place_one(job, p, w, room, set(current.get(job.id, {}).values()), method)
        if placed is None and job.id in current:
            placed = _fall_back(job, current[job.id], room, method)
            if placed is not None:
                result.kept.append(job.id)
        if placed is None:
            result.unplaceable.append(job.id)
            continue
        result.placement[job.id] = placed
    if method == "locality":
        _compact(jobs, result.shapes, cluster, room, result)
    for job_id, placed in result.placement.items():
        old = current.get(job_id, {})
        result.moves += sum(1 for t, n in placed.items() if t in old and old[t] != n)
    return result


def _hold_kept(job: JobView, p: int, w: int, old: JobPlacement, room: _Room) -> dict[str, list[str]] | None:
    """Take room for the tasks a running job keeps at its new shape, where they
    run: ``{"ps": [node, ...], "worker": [...]}`` (fewer tasks of a kind leave
    the nodes holding the fewest of the job's tasks). None, holding nothing, if
    they no longer fit there (other tenants took their room).

    Why: a task that moves costs a process started before the old one stops
    (the runtime switches once the new tasks run), and on a full cluster the
    room for it is held by the job's own old task, so such a rescale waits and
    fails. Placing a resized job from scratch moves and renames its tasks.
    (Holding every resized job's kept tasks before any adds tasks protects
    them from jobs placed earlier, but in the simulator it cost every policy
    10-14% of avg JCT on the contended workload, seed 0: jobs spread wider.)
    """
    by_node = Counter(old.values())
    out = {
        kind: _kept([n for t, n in sorted(old.items()) if t.startswith(kind + "-")], count, by_node)
        for kind, count in (("ps", p), ("worker", w))
    }
    return out if room.take_all(_room_of(job, out)) else None


def _room_of(job: JobView, nodes_of: dict[str, list[str]]) -> list[tuple[str, Resources]]:
    """(node, resources) of each task of ``{"ps": [node, ...], "worker": [...]}``."""
    return [(n, job.ps_resources) for n in nodes_of["ps"]] + [(n, job.worker_resources) for n in nodes_of["worker"]]


def _add_around(job: JobView, p: int, w: int, kept: dict[str, list[str]], room: _Room) -> JobPlacement | None:
    """The tasks a running job adds, next to its own first (workers where it has
    the most tasks, PS where it has the most workers), then on the roomiest
    nodes; with its kept tasks (held by :func:`_hold_kept`). None, giving back
    the kept tasks' room too, if the new ones do not fit."""
    nodes_of = {kind: list(nodes) for kind, nodes in kept.items()}
    taken = _room_of(job, kept)
    amount = dominant(job)
    for kind, count, r in (("worker", w, job.worker_resources), ("ps", p, job.ps_resources)):
        mine = nodes_of["worker"] if kind == "ps" else nodes_of["worker"] + nodes_of["ps"]
        while len(nodes_of[kind]) < count:
            fits = [n for n in room.order if r.fits_in(room.free[n])]
            if not fits:
                room.give_all(taken)
                return None
            node = min(fits, key=lambda n: (-mine.count(n), -amount(room.free[n]), room.order.index(n)))
            room.take(node, r)
            taken.append((node, r))
            nodes_of[kind].append(node)
    out = {f"ps-{i}": n for i, n in enumerate(nodes_of["ps"])}
    out.update({f"worker-{i}": n for i, n in enumerate(nodes_of["worker"])})
    return out


def _kept(have: list[str], count: int, by_node: dict[str, int]) -> list[str]:
    """The nodes of the ``count`` tasks kept of those on ``have`` (in order):
    the ones dropped are on the nodes holding the fewest of the job's tasks."""
    if len(have) <= count:
        return list(have)
    dropped = set(sorted(range(len(have)), key=lambda i: (by_node[have[i]], -i))[: len(have) - count])
    return [n for i, n in enumerate(have) if i not in dropped]


def _fall_back(job: JobView, old: JobPlacement, room: _Room, method: str) -> JobPlacement | None:
    """A running job whose new shape does not fit on the nodes (the policy
    sees one pool; GPUs and CPUs come per node) keeps running at its old shape:
    on its old nodes if they still have room, else placed again. Stopping it
    would cost a restart and the time it waits to be admitted again. Not
    outside the job's limits (they may have been narrowed since it started)."""
    p, w = _shape_of(old)
    if not job.allows(p, w):
        return None
    if _keep(job, old, room):
        return dict(old)
    return _place_one(job, p, w, room, set(old.values()), method)


def _place_one(job: JobView, p: int, w: int, room: _Room, prefer: set[str], method: str) -> JobPlacement | None:
    """``job``'s tasks at (p, w) on nodes with room, by ``method`` (None: they do not fit)."""
    if method == "locality":
        return _locality(job, p, w, room, prefer)
    return {"spread": _spread, "pack": _pack, "optimus": _optimus}[method](job, p, w, room)


def _compact(
    jobs: list[JobView], decision: Decision, cluster: ClusterView, room: _Room, result: PlacementResult
) -> None:
    """Move a job that spans more nodes than the room left (plus its own) would
    need onto fewer nodes, biggest jobs first. A job kept in place because its
    shape did not change, or placed before others finished, can otherwise stay
    spread while whole nodes sit free: for all-reduce jobs that is the
    cross-node penalty paid for nothing."""
    by_id = {j.id: j for j in jobs}
    order = [j.id for j in sorted((by_id[i] for i in result.placement), key=_biggest_first(decision, cluster))]
    moved = True
    while moved:  # a move frees room another job may use; each move lowers the total span, so this ends
        moved = False
        for job_id in order:
            moved |= _compact_one(by_id[job_id], decision[job_id], room, result)


def _compact_one(job: JobView, shape: tuple[int, int], room: _Room, result: PlacementResult) -> bool:
    placed = result.placement[job.id]
    spans = len(set(placed.values()))
    if spans <= 1:
        return False
    held = [(n, task_resources(job, t)) for t, n in placed.items()]
    room.give_all(held)
    need = fewest_nodes(job, *shape, room.free)
    again = _locality(job, *shape, room, set()) if need and need < spans else None
    if again is not None and len(set(again.values())) < spans:
        result.placement[job.id] = again
        return True
    if again is not None:
        room.give_all([(n, task_resources(job, t)) for t, n in again.items()])
    room.take_all(held)  # the room it held a moment ago: it is free again
    return False


def _biggest_first(decision: Decision, cluster: ClusterView) -> Callable[[JobView], tuple[float, str]]:
    """Sort key: the largest dominant share of the cluster first, ties by id."""
    return lambda j: (-j.resources(*decision[j.id]).dominant_share(cluster.capacity), j.id)


def _shape_of(placement: JobPlacement) -> tuple[int, int]:
    return (sum(t.startswith("ps-") for t in placement), sum(t.startswith("worker-") for t in placement))


def _keep(job: JobView, old: JobPlacement, room: _Room) -> bool:
    return room.take_all([(node, task_resources(job, task)) for task, node in old.items()])

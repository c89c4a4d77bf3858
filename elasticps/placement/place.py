"""Placing a round's decision: a node for every task of every job in it
(:func:`place`), with any of the placers (:mod:`elasticps.placement.placers`).

A running job whose shape did not change stays where it is; with the
``locality`` placer, one whose shape changed keeps its tasks where they run
and adds or drops tasks around them (a moved task needs room before its old
one is released), and either is moved onto fewer nodes if it spans more than
the room left would need (compaction). A job is placed whole or reported
unplaceable, never half-placed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from elasticps.errors import ConfigError
from elasticps.placement.placers import PLACERS, locality, place_one
from elasticps.placement.room import Room, dominant, fewest_nodes, task_resources
from elasticps.placement.traffic import JobPlacement
from elasticps.sched.types import ClusterView, Decision, JobView, Resources


@dataclass
class PlacementResult:
    placement: dict[str, JobPlacement] = field(default_factory=dict)
    unplaceable: list[str] = field(default_factory=list)
    moves: int = 0  # running tasks that changed node
    kept: list[str] = field(default_factory=list)  # running jobs whose new shape did not fit: at their old one

    @property
    def shapes(self) -> dict[str, tuple[int, int]]:
        """The shape each placed job runs at: the decision's, or its old one (``kept``)."""
        return {job_id: shape_of(placed) for job_id, placed in self.placement.items()}


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
    room = Room(cluster)
    result = PlacementResult()
    todo = []
    for job_id in sorted(decision):
        job = by_id[job_id]
        p, w = decision[job_id]
        old = current.get(job_id)
        if old is not None and shape_of(old) == (p, w) and _keep(job, old, room):
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
            placed = place_one(job, p, w, room, set(current.get(job.id, {}).values()), method)
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


def _hold_kept(job: JobView, p: int, w: int, old: JobPlacement, room: Room) -> dict[str, list[str]] | None:
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


def _add_around(job: JobView, p: int, w: int, kept: dict[str, list[str]], room: Room) -> JobPlacement | None:
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
            node = min(fits, key=lambda n: (-mine.count(n), -amount(room.free[n]), room.rank[n]))
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


def _fall_back(job: JobView, old: JobPlacement, room: Room, method: str) -> JobPlacement | None:
    """A running job whose new shape does not fit on the nodes (the policy
    sees one pool; GPUs and CPUs come per node) keeps running at its old shape:
    on its old nodes if they still have room, else placed again. Stopping it
    would cost a restart and the time it waits to be admitted again. Not
    outside the job's limits (they may have been narrowed since it started)."""
    p, w = shape_of(old)
    if not job.allows(p, w):
        return None
    if _keep(job, old, room):
        return dict(old)
    return place_one(job, p, w, room, set(old.values()), method)


def _compact(
    jobs: list[JobView], decision: Decision, cluster: ClusterView, room: Room, result: PlacementResult
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


def _compact_one(job: JobView, shape: tuple[int, int], room: Room, result: PlacementResult) -> bool:
    placed = result.placement[job.id]
    spans = len(set(placed.values()))
    if spans <= 1:
        return False
    held = [(n, task_resources(job, t)) for t, n in placed.items()]
    room.give_all(held)
    need = fewest_nodes(job, *shape, room.free)
    again = locality(job, *shape, room, set()) if need and need < spans else None
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


def shape_of(placement: JobPlacement) -> tuple[int, int]:
    return (sum(t.startswith("ps-") for t in placement), sum(t.startswith("worker-") for t in placement))


def _keep(job: JobView, old: JobPlacement, room: Room) -> bool:
    return room.take_all([(node, task_resources(job, task)) for task, node in old.items()])

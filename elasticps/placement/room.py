"""Room on the nodes while placing: a ledger of what each node has free
(:class:`Room`, taken and given back task by task, all or nothing), what is
left once a placement is on the nodes, and how few nodes can hold a shape."""

from __future__ import annotations

from collections.abc import Callable

from elasticps.placement.traffic import JobPlacement
from elasticps.sched.types import ClusterView, JobView, Resources, tasks_of


class Room:
    """Free resources per node while placing (tentative, with rollback)."""

    def __init__(self, cluster: ClusterView) -> None:
        self.order = [n.name for n in cluster.nodes]
        self.rank = {name: i for i, name in enumerate(self.order)}  # a node's place in ``order``, for ties
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
        return count_fit(self.free[node], r)


def count_fit(free: Resources, r: Resources) -> int:
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


def shared_spans(room: list[Resources]) -> Callable[[Resources, Resources], Callable[[int, int], int]]:
    """:func:`spans_on` this ``room`` for each pair of task sizes, made once and
    shared: a round's jobs of one size ask the same shapes, and each answer
    sorts every node's fit."""
    made: dict[tuple[Resources, Resources], Callable[[int, int], int]] = {}

    def of(ps: Resources, worker: Resources) -> Callable[[int, int], int]:
        if (ps, worker) not in made:
            made[(ps, worker)] = spans_on(ps, worker, room)
        return made[(ps, worker)]

    return of


def _fewest(ps: Resources, worker: Resources, p: int, w: int, free: list[Resources]) -> int | None:
    if w == 0:
        return 1 if any(tasks_of(ps, worker, p, 0).fits_in(f) for f in free) else None
    unit = worker + ps.scaled(p / w)
    counts = sorted((count_fit(f, unit) for f in free), reverse=True)
    left = w
    for used, k in enumerate(counts, start=1):
        left -= k
        if left <= 0:
            return used
    return None

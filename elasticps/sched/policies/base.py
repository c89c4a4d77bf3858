"""The protocol every policy implements, and the steps they share.

All policies treat the cluster as one pool of resources (placement fits the
tasks onto nodes afterwards) and share two rules:
- a job gets at least its minimum shape or nothing: it waits rather than
  starting short; jobs already running are admitted first, then by arrival;
- never more than the available capacity, never outside a job's min/max.
Same input, same decision: ties are broken by job id.
"""

from __future__ import annotations

import functools
import heapq
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from elasticps.sched.objectives import objective_of as objective_of
from elasticps.sched.types import ClusterView, Decision, JobView, Resources, tasks_of


@dataclass(frozen=True)
class PolicyState:
    """What a policy remembers between rounds (hysteresis); pass it back in."""

    shrink_wishes: dict[str, int] = field(default_factory=dict)


class Policy(Protocol):
    name: str

    def decide(
        self, jobs: list[JobView], cluster: ClusterView, state: PolicyState | None = None
    ) -> tuple[Decision, PolicyState]: ...


def admission_order(jobs: Iterable[JobView]) -> list[JobView]:
    """Running jobs first, then by arrival."""
    return sorted(jobs, key=lambda j: (j.current is None, j.arrival, j.id))


def min_shape(job: JobView) -> tuple[int, int]:
    return job.min_ps, job.min_workers


def admit(
    jobs: list[JobView],
    available: Resources,
    shape: Callable[[JobView], tuple[int, int]] = min_shape,
    order: Callable[[Iterable[JobView]], list[JobView]] = admission_order,
) -> tuple[Decision, Resources]:
    """Give jobs, in ``order``, ``shape(job)`` while it fits."""
    decision: Decision = {}
    left = available
    for job in order(jobs):
        p, w = shape(job)
        need = job.resources(p, w)
        if need.fits_in(left):
            decision[job.id] = (p, w)
            left = left - need
    return decision, left


Score = Callable[[JobView, tuple[int, int], tuple[int, int]], float | None]


def grow(
    jobs: list[JobView],
    decision: Decision,
    left: Resources,
    score: Score,
    caps: dict[str, tuple[int, int]] | None = None,
    pairs: bool = False,
    jumps: tuple[int, ...] = (1,),
    leaps: bool = False,
) -> tuple[Decision, Resources]:
    """Repeatedly give one more PS or worker to the admitted job whose next task
    scores highest (``score(job, old, new)``, None or <= 0: not worth it), while
    it fits. ``caps`` bounds a job's shape below its maximum. With ``pairs``, a PS
    and a worker together are a third option (a look one step further ahead,
    for models where neither helps alone). ``jumps``: the steps an option may
    take at once (``(1, 2, 4)``: also 2 or 4 more of a kind), tried in turn
    while no shorter one is worth it, so that growth crosses a dip (a shape
    that spans one more node is slower, one a few tasks bigger faster); the
    score is per share of what the whole jump adds. With ``leaps``, where no
    jump pays, a job may leap to a larger shape it has run
    (``JobView.measured``), scored the same way: its measured best can lie
    past a dip no jump crosses (more PS and one more worker, say)."""
    by_id = {j.id: j for j in jobs}
    heap: list[tuple[float, str, tuple[int, int]]] = []
    Best = tuple[float, tuple[int, int]] | None

    def kept(best: Best, job: JobView, old: tuple[int, int], new: tuple[int, int]) -> Best:
        """``best`` or (the score of going to ``new``, ``new``), whichever is higher; a score None or <= 0
        is not worth it."""
        s = score(job, old, new)
        return (s, new) if s is not None and s > 0 and (best is None or s > best[0]) else best

    def push(job: JobView) -> None:
        p, w = decision[job.id]
        cap_p, cap_w = (caps or {}).get(job.id, (job.max_ps, job.max_workers))
        top_p, top_w = min(cap_p, job.max_ps), min(cap_w, job.max_workers)
        best: Best = None
        for d in jumps:  # longer jumps only where no shorter one pays: at a dip, not on a slope
            if p + d > top_p and w + d > top_w:
                continue  # past both caps
            # what each option adds (what _delta returns, worked out once per push)
            more_ps = job.ps_resources if d == 1 else job.ps_resources.scaled(d)
            more_workers = job.worker_resources if d == 1 else job.worker_resources.scaled(d)
            options = [((p, w + d), more_workers), ((p + d, w), more_ps)]
            if pairs:
                options.append(((p + d, w + d), more_ps + more_workers))
            for new, added in options:
                if new[0] > top_p or new[1] > top_w or not added.fits_in(left):
                    continue
                best = kept(best, job, (p, w), new)
            if best is not None:
                break
        if best is None and leaps:
            # no step pays: a leap to a larger shape the job has run, scored per share like a jump
            for new in job.measured:
                if new == (p, w) or new[0] < p or new[1] < w or new[0] > top_p or new[1] > top_w:
                    continue
                if _delta(job, (p, w), new).fits_in(left):
                    best = kept(best, job, (p, w), new)
        if best is not None:
            heapq.heappush(heap, (-best[0], job.id, best[1]))

    for job_id in sorted(decision):
        push(by_id[job_id])
    while heap:
        _, job_id, new = heapq.heappop(heap)
        job = by_id[job_id]
        old = decision[job_id]
        added = _delta(job, old, new)
        if not added.fits_in(left):  # capacity shrank since it was scored: rescore
            push(job)
            continue
        decision[job_id] = new
        left = left - added
        push(job)
    return decision, left


def _delta(job: JobView, old: tuple[int, int], new: tuple[int, int]) -> Resources:
    """What going from ``old`` to ``new`` adds (one task, in the common case)."""
    dp, dw = new[0] - old[0], new[1] - old[1]
    if dw == 0 and dp == 1:
        return job.ps_resources
    if dp == 0 and dw == 1:
        return job.worker_resources
    return _jump(job.ps_resources, job.worker_resources, dp, dw)


#: A jump's tasks (``tasks_of``), worked out once per task size and count.
_jump = functools.lru_cache(maxsize=4096)(tasks_of)


def task_share(job: JobView, old: tuple[int, int], new: tuple[int, int], total: Resources) -> float:
    """Dominant share of the cluster that going from ``old`` to ``new`` adds."""
    return max(_delta(job, old, new).dominant_share(total), 1e-9)

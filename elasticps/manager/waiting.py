"""Why a job is not running: one sentence per waiting job, and whether it can
ever start on this cluster as it is.

A round's decision leaves some jobs without a shape. Each gets the first
reason that holds, in this order: it can never fit (the same test the
simulator applies to its workloads, :func:`elasticps.sched.fit.fit_problem`);
one of its tasks fits on no node's free room; its minimum shape is larger than
all the free room; else the policy gave the room to other jobs. Free room is
what the nodes have for our jobs less what this round's placement put there.
Pure code: no Ray, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from elasticps.sched.fit import describe, fit_problem
from elasticps.sched.types import ClusterView, JobView, Resources, total_of
from elasticps.tables import shape_text


@dataclass(frozen=True)
class Waiting:
    reason: str
    never: bool = False  # the cluster can never hold the job as it is (its nodes would have to change)


SUBMITTED = Waiting("submitted: waiting for the next scheduling round")


def free_after(cluster: ClusterView, placed: dict[str, dict[str, str]], views: dict[str, JobView]) -> list[Resources]:
    """Each node's room for our jobs, less what ``placed`` (job -> task -> node) puts there."""
    used: dict[str, list[Resources]] = {}
    for job, tasks in placed.items():
        view = views.get(job)
        if view is None:
            continue
        for task, node in tasks.items():
            used.setdefault(node, []).append(view.ps_resources if task.startswith("ps-") else view.worker_resources)
    return [(n.available - total_of(used.get(n.name, []))).clamped() for n in cluster.nodes]


def why_waiting(job: JobView, cluster: ClusterView, free: list[Resources], placed_jobs: int) -> Waiting:
    """Why ``job`` got no shape this round (``free``: see :func:`free_after`;
    ``placed_jobs``: how many other jobs hold a shape after it)."""
    problem = fit_problem(job, cluster)
    if problem is not None:
        return Waiting(problem, never=True)
    largest = max(free, key=lambda r: (r.gpu, r.cpu, r.memory_gb), default=Resources())
    largest = Resources(largest.cpu, largest.gpu, largest.memory_gb if job.worker_resources.memory_gb else 0.0)
    kinds = [("a worker", job.worker_resources)] + ([("a PS", job.ps_resources)] if job.min_ps > 0 else [])
    for what, need in kinds:
        if not any(need.fits_in(room) for room in free):
            return Waiting(
                f"waiting for room: {what} needs {describe(need)}, the largest free node has {describe(largest)}"
            )
    need = job.resources(job.min_ps, job.min_workers)
    room = total_of(free)
    if not need.fits_in(room):
        shape = shape_text(job.min_ps, job.min_workers)
        return Waiting(f"waiting for room: needs {describe(need)} at its minimum ({shape}), {describe(room)} free")
    return Waiting(f"queued behind {placed_jobs} job(s): the policy gave them this round's room")

"""Why a job can never run on a cluster, in words (None if it can)."""

from __future__ import annotations

from elasticps.sched.types import ClusterView, JobView, Resources
from elasticps.tables import shape_text


def describe(r: Resources) -> str:
    parts = [f"{r.cpu:g} CPU"]
    if r.gpu:
        parts.append(f"{r.gpu:g} GPU")
    if r.memory_gb:
        parts.append(f"{r.memory_gb:g} GB memory")
    return ", ".join(parts)


def fit_problem(job: JobView, cluster: ClusterView) -> str | None:
    """A sentence saying why ``job`` cannot run even on the whole, empty
    cluster: one of its tasks is larger than every node, or its minimum shape
    is larger than all nodes together. Room that others hold does not count:
    they may leave."""
    if not cluster.nodes:
        return "cannot fit: the cluster has no nodes"
    largest = max(cluster.nodes, key=lambda n: (n.capacity.gpu, n.capacity.cpu, n.capacity.memory_gb)).capacity
    kinds = [("a worker", job.worker_resources)] + ([("a PS", job.ps_resources)] if job.min_ps > 0 else [])
    for what, need in kinds:
        if not any(need.fits_in(n.capacity) for n in cluster.nodes):
            return f"cannot fit: {what} needs {describe(need)}, the largest node has {describe(largest)}"
    need = job.resources(job.min_ps, job.min_workers)
    if not need.fits_in(cluster.capacity):
        return (
            f"cannot fit: needs {describe(need)} at its minimum ({shape_text(job.min_ps, job.min_workers)}), "
            f"the cluster has {describe(cluster.capacity)}"
        )
    return None

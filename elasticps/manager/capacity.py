"""What the cluster has and what others use of it, read from Ray.

Ray's per-node available resources count our own jobs' tasks as used; adding
those back gives the room our policy may hand out, and whatever else is in
use belongs to other tenants (other drivers, other jobs).
"""

from __future__ import annotations

import ray

from elasticps.sched import ClusterView, NodeView, Resources

GB = 1024**3


def _resources(d: dict[str, float]) -> Resources:
    return Resources(cpu=d.get("CPU", 0.0), gpu=d.get("GPU", 0.0), memory_gb=d.get("memory", 0.0) / GB)


def ray_cluster_view(ours: dict[str, Resources]) -> ClusterView:
    """Nodes with their capacity and what others use; ``ours`` is what our
    tasks hold per node id."""
    from ray._private.state import available_resources_per_node  # no public per-node API without the dashboard

    available = available_resources_per_node()
    nodes = []
    for n in ray.nodes():
        if not n.get("Alive") or n["Resources"].get("CPU", 0) <= 0:
            continue
        node_id = n["NodeID"]
        capacity = _resources(n["Resources"])
        free = _resources(available.get(node_id, {}))
        mine = ours.get(node_id, Resources())
        others = capacity - free - mine
        nodes.append(
            NodeView(
                node_id, capacity, Resources(max(0.0, others.cpu), max(0.0, others.gpu), max(0.0, others.memory_gb))
            )
        )
    return ClusterView(tuple(sorted(nodes, key=lambda v: v.name)))


def ray_hostnames() -> dict[str, str]:
    """Ray node id -> host name of every live node (on KubeRay, the pod's name)."""
    return {n["NodeID"]: n.get("NodeManagerHostname", "") for n in ray.nodes() if n.get("Alive")}


#: Changes in other tenants' CPU use smaller than this do not count as events.
OTHERS_CPU_EPSILON = 0.25


def capacity_signature(view: ClusterView) -> dict[str, tuple[float, float]]:
    """Per node: (CPU capacity, CPU used by others): what a round depends on."""
    return {n.name: (n.capacity.cpu, n.used_by_others.cpu) for n in view.nodes}


def capacity_change(before: dict[str, tuple[float, float]] | None, after: dict[str, tuple[float, float]]) -> str:
    """A sentence naming what changed between two signatures ("" if nothing did)."""
    if before is None:
        return ""
    parts = [f"node {n[:12]} joined ({after[n][0]:g} CPU)" for n in sorted(after.keys() - before.keys())]
    parts += [f"node {n[:12]} left" for n in sorted(before.keys() - after.keys())]
    for n in sorted(before.keys() & after.keys()):
        (cap0, oth0), (cap1, oth1) = before[n], after[n]
        if cap0 != cap1:
            parts.append(f"node {n[:12]} now has {cap1:g} CPU (was {cap0:g})")
        elif abs(oth1 - oth0) >= OTHERS_CPU_EPSILON:
            verb = "freed" if oth1 < oth0 else "took"
            parts.append(f"other tenants {verb} {abs(oth1 - oth0):g} CPU on node {n[:12]}")
    return "; ".join(parts)

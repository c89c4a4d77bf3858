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

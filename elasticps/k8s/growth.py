"""How many Ray worker pods the jobs need: pure code, no API calls, no clock.

The Ray cluster is one KubeRay worker group of identical pods. To know whether
more pods would help, the policy and placement (the same code as every round)
run on the Ray cluster plus *virtual* nodes, one per pod that could still be
added: pods already asked for but not yet in Ray, then as many more as fit in
Kubernetes' free room and the group's ``maxReplicas``. The pods worth asking
for are the fewest with which the jobs would run as they would with all of
them (a binary search, which assumes more room never makes the policy choose less). Pods whose Ray node holds nothing of
ours or anyone's, for longer than a grace period, are given back (named in
``workersToDelete`` so that KubeRay removes those and not busy ones).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

from elasticps.placement import place
from elasticps.sched import ClusterView, JobView, NodeView, PolicyState, Resources
from elasticps.sched.policies.base import Policy

VIRTUAL = "+pod-"


@dataclass(frozen=True)
class WorkerGroup:
    """A KubeRay worker group as the growth plan sees it."""

    name: str
    replicas: int
    min_replicas: int
    max_replicas: int
    pod: Resources  # what one worker pod offers Ray (and requests from Kubernetes)


@dataclass(frozen=True)
class ReplicaPlan:
    replicas: int
    workers_to_delete: tuple[str, ...] = ()
    reason: str = ""


def pods_that_fit(pod: Resources, free: list[Resources], limit: int) -> int:
    """How many pods of size ``pod`` the nodes' free room holds (at most ``limit``)."""
    count = 0
    for room in free:
        per_node = [room.cpu / pod.cpu if pod.cpu else math.inf]
        per_node.append(room.gpu / pod.gpu if pod.gpu else math.inf)
        per_node.append(room.memory_gb / pod.memory_gb if pod.memory_gb else math.inf)
        fit = min(per_node)
        count += int(min(fit, limit) + 1e-9) if math.isfinite(fit) else limit
        if count >= limit:
            return limit
    return count


def plan_replicas(
    policy: Policy,
    jobs: list[JobView],
    ray_cluster: ClusterView,
    state: PolicyState,
    group: WorkerGroup,
    pending_pods: int,
    fit: int,
    idle_pods: list[str],
    current: dict[str, dict[str, str]] | None = None,
    placement: str = "locality",
) -> ReplicaPlan:
    """The group's replicas (and pods to delete) that serve ``jobs`` best.

    ``pending_pods``: replicas asked for whose Ray node has not joined yet;
    ``fit``: further pods Kubernetes has room for; ``idle_pods``: pods whose Ray
    node has been idle past the grace period; ``current``: the running jobs'
    placements (they stay where they are).
    """
    extra = max(0, min(fit, group.max_replicas - group.replicas))
    virtual = tuple(NodeView(f"{VIRTUAL}{i}", group.pod) for i in range(pending_pods + extra))

    def runs_with(k: int) -> dict[str, tuple[int, int]]:
        """What the jobs would run with ``k`` more pods (shapes of the jobs placement could place)."""
        wider = ClusterView(ray_cluster.nodes + virtual[:k])
        decision, _ = policy.decide(jobs, wider, copy.deepcopy(state))
        placed = place(jobs, decision, wider, current or {}, placement)
        return placed.shapes

    # the fewest pods with which the jobs run as they would with all of them
    best = runs_with(len(virtual))
    lo, hi = 0, len(virtual)
    while lo < hi:
        mid = (lo + hi) // 2
        if runs_with(mid) == best:
            hi = mid
        else:
            lo = mid + 1
    wanted = lo
    if wanted > pending_pods:
        grow = wanted - pending_pods
        return ReplicaPlan(group.replicas + grow, reason=f"{grow} more pod(s) would run tasks the jobs want")
    removable = max(0, group.replicas - group.min_replicas)
    # pending pods nobody needs any more are dropped first, then idle ones
    drop_pending = min(pending_pods - wanted, removable)
    delete = tuple(sorted(idle_pods))[: max(0, removable - drop_pending)]
    if drop_pending or delete:
        return ReplicaPlan(
            group.replicas - drop_pending - len(delete),
            delete,
            reason=f"{drop_pending + len(delete)} pod(s) no longer needed",
        )
    return ReplicaPlan(group.replicas, reason="")

"""Growing and shrinking the Ray cluster through its KubeRay ``RayCluster`` object.

:class:`KubeRay` reads a worker group of a ``RayCluster`` (``ray.io/v1``) and
sets its ``replicas`` (with ``scaleStrategy.workersToDelete`` naming the pods
to remove when it shrinks) by a JSON patch that first tests the group's name,
so a concurrent edit of the list fails instead of changing the wrong group.
:class:`KubeRayGrowth` is what the manager calls every round: it gathers the
inputs of :func:`elasticps.k8s.growth.plan_replicas` from Kubernetes and Ray
and applies the plan.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from elasticps.errors import ConfigError
from elasticps.k8s.capacity import KubeCapacity
from elasticps.k8s.growth import ReplicaPlan, WorkerGroup, plan_replicas, pods_that_fit
from elasticps.k8s.resources import GIB, parse_quantity, pod_request, to_resources
from elasticps.sched import ClusterView, JobView, PolicyState, Resources
from elasticps.sched.policies.base import Policy

GROUP, VERSION, PLURAL = "ray.io", "v1", "rayclusters"


def ray_resources(group_spec: dict[str, Any]) -> Resources:
    """What one pod of a worker group offers Ray: ``rayStartParams`` first, then
    the Ray container's limits, then its requests (as KubeRay decides)."""
    params = group_spec.get("rayStartParams") or {}
    containers = ((group_spec.get("template") or {}).get("spec") or {}).get("containers") or [{}]
    res = containers[0].get("resources") or {}
    from_container = to_resources({**(res.get("requests") or {}), **(res.get("limits") or {})})
    cpu = float(parse_quantity(params["num-cpus"])) if "num-cpus" in params else from_container.cpu
    gpu = float(parse_quantity(params["num-gpus"])) if "num-gpus" in params else from_container.gpu
    mem = float(parse_quantity(params["memory"]) / GIB) if "memory" in params else from_container.memory_gb
    return Resources(cpu, gpu, mem)


class KubeRay:
    """One worker group of one ``RayCluster``."""

    def __init__(self, api_client: Any, namespace: str, name: str, group: str | None = None) -> None:
        from kubernetes import client

        self.api = client.CustomObjectsApi(api_client)
        self.namespace, self.name, self.group = namespace, name, group

    def read(self) -> dict[str, Any]:
        return self.api.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, self.name)

    def worker_group(self) -> tuple[int, WorkerGroup, dict[str, Any]]:
        """(index in ``workerGroupSpecs``, the group, its raw spec)."""
        groups = self.read().get("spec", {}).get("workerGroupSpecs") or []
        for i, g in enumerate(groups):
            if self.group is None or g.get("groupName") == self.group:
                replicas = int(g.get("replicas", g.get("minReplicas", 0)))
                return (
                    i,
                    WorkerGroup(
                        name=g["groupName"],
                        replicas=replicas,
                        min_replicas=int(g.get("minReplicas", 0)),
                        max_replicas=int(g.get("maxReplicas", replicas)),
                        pod=ray_resources(g),
                    ),
                    g,
                )
        raise ConfigError(
            f"RayCluster {self.namespace}/{self.name} has no worker group"
            + (f" named {self.group!r}" if self.group else "")
        )

    def apply(self, index: int, group: str, plan: ReplicaPlan) -> None:
        base = f"/spec/workerGroupSpecs/{index}"
        patch: list[dict[str, Any]] = [
            {"op": "test", "path": f"{base}/groupName", "value": group},
            {"op": "add", "path": f"{base}/replicas", "value": plan.replicas},
        ]
        if plan.workers_to_delete:
            strategy = {"workersToDelete": list(plan.workers_to_delete)}
            patch.append({"op": "add", "path": f"{base}/scaleStrategy", "value": strategy})
        self.api.patch_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, self.name, patch, _content_type="application/json-patch+json"
        )


class KubeRayGrowth:
    """Keeps the worker group as big as the jobs can use and Kubernetes can hold.

    A Ray node is matched to its pod by host name (KubeRay's pods are named
    like their host). A pod counts as idle once its Ray node holds none of our
    tasks and nothing of anyone else's; it is given back after ``idle_grace_s``.
    """

    def __init__(
        self,
        capacity: KubeCapacity,
        kuberay: KubeRay,
        idle_grace_s: float = 120.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.capacity, self.kuberay = capacity, kuberay
        self.idle_grace_s, self.clock = idle_grace_s, clock
        self._idle_since: dict[str, float] = {}

    def reconcile(
        self,
        policy: Policy,
        jobs: list[JobView],
        ray_cluster: ClusterView,
        state: PolicyState,
        ours_by_node: dict[str, Resources],
        hostnames: dict[str, str],
        current: dict[str, dict[str, str]] | None = None,
        placement: str = "locality",
    ) -> ReplicaPlan | None:
        """Patch the group when the plan differs from it; returns the plan applied (None if none)."""
        index, group, raw = self.kuberay.worker_group()
        pods = {
            p["metadata"]["name"]
            for p in self.capacity.pods(
                {"ray.io/cluster": self.kuberay.name, "ray.io/group": group.name}, self.kuberay.namespace
            )
        }
        in_ray = {node: host for node, host in hostnames.items() if host in pods}
        pending = max(0, group.replicas - len(in_ray))
        template = (raw.get("template") or {}).get("spec") or {}
        fit = pods_that_fit(
            pod_request(template), list(self.capacity.free().values()), max(0, group.max_replicas - group.replicas)
        )
        idle = self._idle(in_ray, ray_cluster, ours_by_node)
        plan = plan_replicas(policy, jobs, ray_cluster, state, group, pending, fit, idle, current, placement)
        if plan.replicas == group.replicas and not plan.workers_to_delete:
            return None
        self.kuberay.apply(index, group.name, plan)
        for pod in plan.workers_to_delete:
            self._idle_since.pop(pod, None)
        return plan

    def _idle(self, in_ray: dict[str, str], ray_cluster: ClusterView, ours_by_node: dict[str, Resources]) -> list[str]:
        now = self.clock()
        others = {n.name: n.used_by_others for n in ray_cluster.nodes}
        idle_now = set()
        for node, pod in in_ray.items():
            ours = ours_by_node.get(node, Resources())
            theirs = others.get(node, Resources())
            if ours.cpu <= 0 and ours.gpu <= 0 and theirs.cpu <= 0 and theirs.gpu <= 0:
                idle_now.add(pod)
                self._idle_since.setdefault(pod, now)
        for pod in list(self._idle_since):
            if pod not in idle_now:
                del self._idle_since[pod]
        return sorted(p for p, since in self._idle_since.items() if now - since >= self.idle_grace_s)

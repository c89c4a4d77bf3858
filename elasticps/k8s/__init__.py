"""Kubernetes: free capacity from Nodes and Pods, and growing the Ray cluster on KubeRay."""

from typing import TYPE_CHECKING

from elasticps._lazy import lazy_exports

if TYPE_CHECKING:
    from elasticps.k8s.capacity import KubeCapacity
    from elasticps.k8s.growth import ReplicaPlan, WorkerGroup, plan_replicas, pods_that_fit
    from elasticps.k8s.kuberay import KubeRay, KubeRayGrowth


_EXPORTS = {
    "KubeCapacity": "elasticps.k8s.capacity",
    "ReplicaPlan": "elasticps.k8s.growth",
    "WorkerGroup": "elasticps.k8s.growth",
    "plan_replicas": "elasticps.k8s.growth",
    "pods_that_fit": "elasticps.k8s.growth",
    "KubeRay": "elasticps.k8s.kuberay",
    "KubeRayGrowth": "elasticps.k8s.kuberay",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = ["KubeCapacity", "KubeRay", "KubeRayGrowth", "ReplicaPlan", "WorkerGroup", "plan_replicas", "pods_that_fit"]

"""Kubernetes: free capacity from Nodes and Pods, and growing the Ray cluster on KubeRay."""

from elasticps.k8s.capacity import KubeCapacity
from elasticps.k8s.growth import ReplicaPlan, WorkerGroup, plan_replicas, pods_that_fit
from elasticps.k8s.kuberay import KubeRay, KubeRayGrowth

__all__ = ["KubeCapacity", "KubeRay", "KubeRayGrowth", "ReplicaPlan", "WorkerGroup", "plan_replicas", "pods_that_fit"]

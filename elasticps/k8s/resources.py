"""Kubernetes quantities and what nodes and pods hold, as plain data (no API calls).

A pod's request is what the kube-scheduler counts: the larger of the sum of
its containers' requests and the largest init container's request, plus the
pod overhead. Pods that finished (``Succeeded``/``Failed``) or are not bound
to a node hold nothing.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Any

from kubernetes.utils import parse_quantity as _parse_quantity

from elasticps.sched import Resources

GIB = Decimal(1024**3)
GPU_KEYS = ("nvidia.com/gpu", "amd.com/gpu")


def parse_quantity(value: str | int | float) -> Decimal:
    """``"500m"`` -> 0.5, ``"2Gi"`` -> 2147483648, ``"1e3"`` -> 1000 (the
    kubernetes client's parser); ValueError names a bad one."""
    try:
        return Decimal(_parse_quantity(value))
    except (ValueError, TypeError, InvalidOperation):
        raise ValueError(f"not a Kubernetes quantity: {value!r}") from None


def to_resources(amounts: dict[str, Any] | None) -> Resources:
    """A ``{"cpu": "500m", "memory": "1Gi", "nvidia.com/gpu": 1}`` map as :class:`Resources`."""
    amounts = amounts or {}
    gpu = sum((parse_quantity(amounts[k]) for k in GPU_KEYS if k in amounts), Decimal(0))
    return Resources(
        cpu=float(parse_quantity(amounts.get("cpu", 0))),
        gpu=float(gpu),
        memory_gb=float(parse_quantity(amounts.get("memory", 0)) / GIB),
    )


def _requests(container: dict[str, Any]) -> Resources:
    return to_resources((container.get("resources") or {}).get("requests"))


def _max(a: Resources, b: Resources) -> Resources:
    return Resources(max(a.cpu, b.cpu), max(a.gpu, b.gpu), max(a.memory_gb, b.memory_gb))


def pod_request(pod_spec: dict[str, Any]) -> Resources:
    """What the scheduler reserves for a pod with this spec (camelCase keys, as the API sends)."""
    total = Resources()
    for c in pod_spec.get("containers") or []:
        total = total + _requests(c)
    for c in pod_spec.get("initContainers") or []:
        total = _max(total, _requests(c))
    return total + to_resources(pod_spec.get("overhead"))


def holds_resources(pod: dict[str, Any]) -> bool:
    """Bound to a node and not finished."""
    phase = (pod.get("status") or {}).get("phase")
    return bool((pod.get("spec") or {}).get("nodeName")) and phase not in ("Succeeded", "Failed")


def node_schedulable(node: dict[str, Any]) -> bool:
    """Not cordoned, and Ready unless it says nothing about readiness."""
    if (node.get("spec") or {}).get("unschedulable"):
        return False
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return cond.get("status") == "True"
    return True

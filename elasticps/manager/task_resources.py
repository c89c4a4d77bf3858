"""What one task of a job spec takes: as the policy and placement count it,
and as the runtime reserves it in Ray."""

from __future__ import annotations

from elasticps.manager.spec import TaskSpec
from elasticps.runtime import TaskResources
from elasticps.sched import Resources


def policy_resources(task: TaskSpec) -> Resources:
    """What one task of this kind takes, as the policy and placement count it."""
    return Resources(cpu=task.cpu, gpu=task.gpu, memory_gb=task.memory_gb)


def runtime_resources(task: TaskSpec) -> TaskResources:
    """What one task of this kind asks of Ray, and its CPU limit."""
    return TaskResources(
        cpu=task.cpu, gpu=task.gpu, memory_bytes=int(task.memory_gb * 1024**3), cpu_limit=task.cpu_limit
    )

"""The configuration manager: job specs, the durable store, the control loop and its client."""

from elasticps.manager.client import Client, ManagerError
from elasticps.manager.runtime import CapacitySource, JobHandle, JobRuntime, JobStatus, Launch, ProgramInfo
from elasticps.manager.service import ClusterGrowth, Manager
from elasticps.manager.spec import JobSpec, LimitsPatch, TaskSpec, parse_spec
from elasticps.manager.states import IllegalTransition, JobState
from elasticps.manager.store import JobRecord, Retention, Store
from elasticps.manager.workdir import WorkdirLock

__all__ = [
    "CapacitySource",
    "Client",
    "ClusterGrowth",
    "IllegalTransition",
    "JobHandle",
    "JobRecord",
    "JobRuntime",
    "JobSpec",
    "JobState",
    "JobStatus",
    "Launch",
    "LimitsPatch",
    "Manager",
    "ManagerError",
    "ProgramInfo",
    "Retention",
    "Store",
    "TaskSpec",
    "WorkdirLock",
    "parse_spec",
]

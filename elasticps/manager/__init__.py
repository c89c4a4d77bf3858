"""The configuration manager: job specs, the durable store, the control loop and its client."""

from typing import TYPE_CHECKING

from elasticps._lazy import lazy_exports

if TYPE_CHECKING:
    from elasticps.manager.client import Client, ManagerError
    from elasticps.manager.runtime import CapacitySource, JobHandle, JobRuntime, JobStatus, Launch, ProgramInfo
    from elasticps.manager.service import ClusterGrowth, Manager
    from elasticps.manager.spec import JobSpec, LimitsPatch, TaskSpec, parse_spec
    from elasticps.manager.states import IllegalTransition, JobState
    from elasticps.manager.store import JobRecord, Retention, Store
    from elasticps.manager.workdir import WorkdirLock


_EXPORTS = {
    "Client": "elasticps.manager.client",
    "ManagerError": "elasticps.manager.client",
    "CapacitySource": "elasticps.manager.runtime",
    "JobHandle": "elasticps.manager.runtime",
    "JobRuntime": "elasticps.manager.runtime",
    "JobStatus": "elasticps.manager.runtime",
    "Launch": "elasticps.manager.runtime",
    "ProgramInfo": "elasticps.manager.runtime",
    "ClusterGrowth": "elasticps.manager.service",
    "Manager": "elasticps.manager.service",
    "JobSpec": "elasticps.manager.spec",
    "LimitsPatch": "elasticps.manager.spec",
    "TaskSpec": "elasticps.manager.spec",
    "parse_spec": "elasticps.manager.spec",
    "IllegalTransition": "elasticps.manager.states",
    "JobState": "elasticps.manager.states",
    "JobRecord": "elasticps.manager.store",
    "Retention": "elasticps.manager.store",
    "Store": "elasticps.manager.store",
    "WorkdirLock": "elasticps.manager.workdir",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

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

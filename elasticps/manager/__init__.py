"""The configuration manager: job specs, the durable store, the control loop and its client."""

from elasticps.manager.client import Client, ManagerError
from elasticps.manager.service import ClusterGrowth, Manager
from elasticps.manager.spec import JobSpec, TaskSpec, parse_spec
from elasticps.manager.store import JobRecord, Store

__all__ = [
    "Client",
    "ClusterGrowth",
    "JobRecord",
    "JobSpec",
    "Manager",
    "ManagerError",
    "Store",
    "TaskSpec",
    "parse_spec",
]

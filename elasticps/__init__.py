"""elasticps: elastic resource allocation for parameter-server training on shared clusters."""

from typing import TYPE_CHECKING

from elasticps._lazy import lazy_exports

if TYPE_CHECKING:
    from elasticps.errors import (
        ConfigError,
        ElasticPSError,
        JobEndedError,
        JobFailedError,
        PlacementError,
        ProgramError,
    )
    from elasticps.k8s import KubeCapacity, KubeRay, KubeRayGrowth
    from elasticps.manager import Client, JobRuntime, JobSpec, JobState, Manager, Store, parse_spec
    from elasticps.program import ELEMENTWISE_OPTIMIZERS, TrainingProgram, load_program
    from elasticps.runtime import (
        EpochReport,
        JobConfig,
        JobController,
        JobReport,
        RescaleRecord,
        TaskResources,
        WindowReport,
        relative_error,
        train_single_process,
    )

__version__ = "0.1.0"

_EXPORTS = {
    "ConfigError": "elasticps.errors",
    "ElasticPSError": "elasticps.errors",
    "JobEndedError": "elasticps.errors",
    "JobFailedError": "elasticps.errors",
    "PlacementError": "elasticps.errors",
    "ProgramError": "elasticps.errors",
    "KubeCapacity": "elasticps.k8s",
    "KubeRay": "elasticps.k8s",
    "KubeRayGrowth": "elasticps.k8s",
    "Client": "elasticps.manager",
    "JobRuntime": "elasticps.manager",
    "JobSpec": "elasticps.manager",
    "JobState": "elasticps.manager",
    "Manager": "elasticps.manager",
    "Store": "elasticps.manager",
    "parse_spec": "elasticps.manager",
    "ELEMENTWISE_OPTIMIZERS": "elasticps.program",
    "TrainingProgram": "elasticps.program",
    "load_program": "elasticps.program",
    "EpochReport": "elasticps.runtime",
    "JobConfig": "elasticps.runtime",
    "JobController": "elasticps.runtime",
    "JobReport": "elasticps.runtime",
    "RescaleRecord": "elasticps.runtime",
    "TaskResources": "elasticps.runtime",
    "WindowReport": "elasticps.runtime",
    "relative_error": "elasticps.runtime",
    "train_single_process": "elasticps.runtime",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [
    "ELEMENTWISE_OPTIMIZERS",
    "Client",
    "ConfigError",
    "ElasticPSError",
    "EpochReport",
    "JobConfig",
    "JobController",
    "JobEndedError",
    "JobFailedError",
    "JobReport",
    "JobRuntime",
    "JobSpec",
    "JobState",
    "KubeCapacity",
    "KubeRay",
    "KubeRayGrowth",
    "Manager",
    "PlacementError",
    "ProgramError",
    "RescaleRecord",
    "Store",
    "TaskResources",
    "TrainingProgram",
    "WindowReport",
    "__version__",
    "load_program",
    "parse_spec",
    "relative_error",
    "train_single_process",
]

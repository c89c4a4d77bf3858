"""elasticps: elastic resource allocation for parameter-server training on shared clusters."""

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

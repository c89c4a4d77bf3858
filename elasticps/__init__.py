"""elasticps: elastic resource allocation for parameter-server training on shared clusters."""

from elasticps.errors import ConfigError, ElasticPSError, JobFailedError, PlacementError, ProgramError
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
    "ConfigError",
    "ElasticPSError",
    "EpochReport",
    "JobConfig",
    "JobController",
    "JobFailedError",
    "JobReport",
    "PlacementError",
    "ProgramError",
    "RescaleRecord",
    "TaskResources",
    "TrainingProgram",
    "WindowReport",
    "__version__",
    "load_program",
    "relative_error",
    "train_single_process",
]

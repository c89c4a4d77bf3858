"""The elastic parameter-server runtime on Ray."""

from elasticps.runtime.checkpoint import Checkpoint, CheckpointStore
from elasticps.runtime.config import JobConfig, TaskResources
from elasticps.runtime.controller import JobController, Shape
from elasticps.runtime.reference import relative_error, train_single_process
from elasticps.runtime.reports import EpochReport, JobReport, RescaleRecord, WindowReport, noise_scale

__all__ = [
    "Checkpoint",
    "CheckpointStore",
    "EpochReport",
    "JobConfig",
    "JobController",
    "JobReport",
    "RescaleRecord",
    "Shape",
    "TaskResources",
    "WindowReport",
    "noise_scale",
    "relative_error",
    "train_single_process",
]

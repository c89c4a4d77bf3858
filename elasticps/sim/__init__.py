"""A discrete-event simulator that drives the same policy and placement code as
the live manager, on a modelled cluster."""

from elasticps.sim.engine import ORACLE, SimConfig, SimResult, gain_captured, simulate
from elasticps.sim.workload import WorkloadJob, load_workload, synthetic_workload

__all__ = [
    "ORACLE",
    "SimConfig",
    "SimResult",
    "WorkloadJob",
    "gain_captured",
    "load_workload",
    "simulate",
    "synthetic_workload",
]

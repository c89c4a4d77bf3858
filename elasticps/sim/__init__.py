"""A discrete-event simulator that drives the same policy and placement code as
the live manager, on a modelled cluster."""

from elasticps.sim.config import ORACLE, SimConfig
from elasticps.sim.engine import simulate
from elasticps.sim.results import SimResult, gain_captured
from elasticps.sim.traces import load_trace_csv, trace_workload
from elasticps.sim.workload import WorkloadJob, load_workload, synthetic_workload

__all__ = [
    "ORACLE",
    "SimConfig",
    "SimResult",
    "WorkloadJob",
    "gain_captured",
    "load_trace_csv",
    "load_workload",
    "simulate",
    "synthetic_workload",
    "trace_workload",
]

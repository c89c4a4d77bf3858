"""A discrete-event simulator that drives the same policy and placement code as
the live manager, on a modelled cluster."""

from elasticps.sim.engine import SimConfig, SimResult, simulate
from elasticps.sim.workload import WorkloadJob, load_workload, synthetic_workload

__all__ = ["SimConfig", "SimResult", "WorkloadJob", "load_workload", "simulate", "synthetic_workload"]

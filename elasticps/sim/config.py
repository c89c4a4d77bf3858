"""What a simulation is asked to run: the modelled cluster, the policy and
placement, the noise and the ground truth (:class:`SimConfig`), and the check
that every job of a workload could ever run on that cluster."""

from __future__ import annotations

from dataclasses import dataclass

from elasticps.errors import ConfigError
from elasticps.sched import ClusterView, JobView, NodeView, Resources
from elasticps.sched.fit import describe, fit_problem
from elasticps.sched.objectives import DEFAULT_EFFICIENCY_THRESHOLD
from elasticps.sim.truth import OPTIMUS
from elasticps.sim.workload import WorkloadJob

#: ``--policy oracle``: the elastic policy's decisions, admission and placement,
#: made knowing each job's true speed (a bound on what learning the speeds can give).
ORACLE = "oracle"
#: ``--policy kind-oracle``: the same, knowing each job's kind's true speed (the mean
#: over the truth surfaces its kind's jobs follow) but not which one the job follows: a
#: bound on what learning each kind's speeds, and nothing of each job's own, can give.
#: Under ``--truth optimus`` and ``grid`` every job of a kind follows one surface, so it
#: decides as the oracle does.
KIND_ORACLE = "kind-oracle"
ORACLES = (ORACLE, KIND_ORACLE)


@dataclass(frozen=True)
class SimConfig:
    nodes: int = 64
    node_cpu: float = 32.0
    node_memory_gb: float = 256.0
    node_gpu: float = 0.0
    interval_s: float = 300.0
    rescale_pause_s: float = 30.0
    policy: str = "elastic"
    objective: str = "goodput"
    efficiency_threshold: float = DEFAULT_EFFICIENCY_THRESHOLD
    joint_trades: int = 0  # the elastic policy's joint search: trades a round may make (0: none)
    placement: str = "locality"
    noise: float = 0.05
    local_traffic_factor: float = 0.25
    tenant_change_s: float = 3600.0
    tenant_max_share: float = 0.5
    fleet_prior: bool = True
    job_speed_spread: float = 0.0  # jobs of one kind differ: each job's speed x lognormal(0, this)
    seed: int = 0
    truth: str = OPTIMUS  # elasticps.sim.truth.TRUTHS: the ground truth's speed surfaces
    truth_grid: str = ""  # a `bench shapes` JSON the grid surface follows ("": the project's own, GRID_PATH)
    # A round that starts waiting jobs when a job arrives or ends, as the live manager's (elasticps.sched.rounds);
    # False: rounds only every interval and when tenants change (how the simulator decided before).
    event_rounds: bool = True


def worker_resources(spec: WorkloadJob) -> Resources:
    return Resources(cpu=spec.worker_cpu, gpu=spec.worker_gpu, memory_gb=spec.worker_memory_gb)


def check_fits(workload: list[WorkloadJob], config: SimConfig) -> None:
    """Raise :class:`ConfigError` naming the first job that could never run on
    the empty modelled cluster (it would wait for ever)."""
    capacity = Resources(cpu=config.node_cpu, gpu=config.node_gpu, memory_gb=config.node_memory_gb)
    cluster = ClusterView(tuple(NodeView(f"n{i:04d}", capacity) for i in range(config.nodes)))
    for spec in workload:
        view = JobView(
            id=spec.id,
            speed=lambda p, w: 0.0,
            min_ps=spec.min_ps,
            max_ps=spec.max_ps,
            min_workers=spec.min_workers,
            max_workers=spec.max_workers,
            ps_resources=Resources(cpu=spec.ps_cpu, memory_gb=spec.ps_memory_gb),
            worker_resources=worker_resources(spec),
        )
        problem = fit_problem(view, cluster)
        static = view.resources(spec.static_ps, spec.static_workers)
        if problem is None and config.policy == "static" and not static.fits_in(cluster.capacity):
            problem = (
                f"cannot fit: its static shape needs {describe(static)}, the cluster has {describe(cluster.capacity)}"
            )
        if problem is not None:
            raise ConfigError(
                f"job {spec.id} {problem} ({config.nodes} nodes x {config.node_cpu:g} CPU, "
                f"{config.node_memory_gb:g} GB memory)"
            )

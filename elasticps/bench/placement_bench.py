"""``elasticps bench placement``: cross-node bytes measured by the runtime on a
real multi-node Ray cluster, for the same jobs placed by ``locality`` and by
``spread``.

A local multi-raylet cluster (``ray.cluster_utils.Cluster``: a head and
``nodes`` nodes of 4 CPUs). Three digits jobs (the MLP widened to 512 hidden
units, 0.30M parameters) at shapes 2x6, 1x3 and 2x2; PS tasks ask 0.5 CPU and
workers 1 CPU: 13.5 of the 16 CPUs, and job-a (7 CPUs) cannot fit on one node. The placement is computed by
:func:`elasticps.placement.place` from the nodes' Ray resources, applied with
the runtime's hard node affinity, and each job trains ``steps`` steps; the
figure is the sum of the runtime's measured bytes between different nodes.
"""

from __future__ import annotations

import os
from typing import Any

from elasticps.examples import digits
from elasticps.placement import cross_node_bytes_per_step, place
from elasticps.program import TrainingProgram
from elasticps.runtime import JobConfig, JobController, TaskResources
from elasticps.sched import ClusterView, JobView, NodeView, Resources

SHAPES = {"job-a": (2, 6), "job-b": (1, 3), "job-c": (2, 2)}
PS_CPU, WORKER_CPU = 0.5, 1.0


def _program(name: str) -> TrainingProgram:
    base = digits.program(epochs=100)
    return TrainingProgram(**{**base.__dict__, "name": name, "model": _wide_mlp})


def _wide_mlp():
    return digits.mlp(hidden=512)


def run(steps: int = 20, nodes: int = 4) -> dict[str, Any]:
    import ray
    from ray.cluster_utils import Cluster

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    try:
        for _ in range(nodes):
            cluster.add_node(num_cpus=4)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, logging_level="ERROR")
        ray_nodes = [n for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU", 0) > 0]
        view = ClusterView(
            tuple(NodeView(n["NodeID"], Resources(cpu=n["Resources"]["CPU"], memory_gb=64.0)) for n in ray_nodes)
        )
        jobs = [
            JobView(
                id=name,
                speed=lambda p, w: 1.0,
                max_ps=4,
                max_workers=8,
                ps_resources=Resources(cpu=PS_CPU),
                worker_resources=Resources(cpu=WORKER_CPU),
            )
            for name in SHAPES
        ]
        numel = sum(p.numel() for p in _wide_mlp().parameters())
        out: dict[str, Any] = {
            "workload": {"jobs": SHAPES, "params": numel, "steps_per_job": steps, "nodes": nodes},
        }
        for method in ("locality", "spread"):
            result = place(jobs, dict(SHAPES), view, method=method)
            assert not result.unplaceable, result.unplaceable
            measured = predicted = 0
            for name, placement in sorted(result.placement.items()):
                config = JobConfig(
                    report_interval_s=3600,
                    ps_resources=TaskResources(cpu=PS_CPU),
                    worker_resources=TaskResources(cpu=WORKER_CPU),
                    gns_every_steps=0,
                )
                job = JobController(_program(name), config, *SHAPES[name], placement=placement)
                job.run(max_steps=steps)
                measured += job.report().cross_node_bytes
                predicted += int(cross_node_bytes_per_step(placement, 4 * numel) * steps)
                job.shutdown()
            out[method] = {
                "measured_cross_node_bytes": measured,
                "model_cross_node_bytes": predicted,
                "nodes_used": {j: len(set(p.values())) for j, p in result.placement.items()},
            }
        out["reduction_vs_spread"] = 1.0 - out["locality"]["measured_cross_node_bytes"] / max(
            1, out["spread"]["measured_cross_node_bytes"]
        )
        return out
    finally:
        ray.shutdown()
        cluster.shutdown()

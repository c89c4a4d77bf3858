"""``elasticps bench shapes``: a real job's samples/s over a (#PS, #workers) grid.

A local multi-raylet Ray cluster (``ray.cluster_utils.Cluster``: ``nodes``
nodes of ``node_cpus`` logical CPUs, each with the object store ``bench peers``
gives its nodes: with Ray's default 150 MiB a step's gradients spill to
disk). Every task asks 1 CPU and is held to ``cores_per_task`` real cores
(:mod:`elasticps.runtime.cpu_limit`, standing in for a container's CPU
limit); the largest shape's tasks together must use less than this
machine's cores (else :func:`run` refuses), so each shape's speed is its
own, not a share of a contended machine. One job (``model``, one of :data:`MODELS`: by default the
synthetic 10.0M-parameter MLP, 40 MB of float32 parameters, Adam, global
batch 256; sync mode) is rescaled through every shape of the grid; each shape
is placed by :func:`elasticps.placement.place` (``locality``) and timed over
``steps`` steps after a warm-up step. The grid is walked forward and then
backward, so a slow drift of the machine's speed averages out; each shape's
figure is the median of its passes.

The result is the reference ``elasticps bench explore`` replays the scheduler's
probe walk against.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from elasticps.bench.peers.common import NODE_OBJECT_STORE_BYTES, add_node
from elasticps.examples import embedding, synthetic, transformer
from elasticps.placement import place
from elasticps.program import TrainingProgram
from elasticps.runtime import JobConfig, JobController, TaskResources
from elasticps.sched import ClusterView, JobView, NodeView, Resources
from elasticps.tables import shape_text

JOB = "shapes"
#: Enough samples that no pass ends an epoch's worth of shuffling early.
_SAMPLES_PER_BATCH = 64
_EPOCHS = 100_000

#: Models whose speed surfaces differ: ``name: (what it is, builder of its
#: program at a global batch)``. The MLP's best shape has a few more workers
#: than PS; the transformer is compute-bound (workers split its step); the
#: embedding model is PS-bound (Adam over a 1M-row, 16M-parameter table and every
#: worker's dense table gradient summed on the shards).
MODELS: dict[str, tuple[str, Callable[[int], TrainingProgram]]] = {
    "mlp10m": (
        "synthetic MLP 512-2048-2048-2048-256, 10.0M float32 parameters (40 MB), Adam",
        lambda batch: synthetic.program(batch_size=batch, epochs=_EPOCHS, num_samples=batch * _SAMPLES_PER_BATCH),
    ),
    "transformer2m": (
        "transformer encoder, width 256, 4 layers, 8 heads, 2.1M parameters, AdamW",
        lambda batch: transformer.program(
            epochs=_EPOCHS, batch_size=batch, samples=batch * _SAMPLES_PER_BATCH, width=256, layers=4, heads=8
        ),
    ),
    "embedding16m": (
        "EmbeddingBag 1M x 16 (dense gradient) and a 64-64-1 MLP, 16.0M parameters (64 MB), Adam",
        lambda batch: embedding.program(batch_size=batch, samples=batch * _SAMPLES_PER_BATCH, epochs=_EPOCHS),
    ),
}


def grid_shapes(max_ps: int, max_workers: int, max_tasks: int) -> list[tuple[int, int]]:
    """Every (p, w) with 1 <= p <= max_ps, 1 <= w <= max_workers, p + w <= max_tasks."""
    return [(p, w) for p in range(1, max_ps + 1) for w in range(1, max_workers + 1) if p + w <= max_tasks]


def walk_order(shapes: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Shapes in an order where each differs little from the one before (a
    snake through the grid: workers up for PS 1, down for PS 2, ...)."""
    out = []
    for p in sorted({s[0] for s in shapes}):
        row = sorted(s for s in shapes if s[0] == p)
        out.extend(row if p % 2 else row[::-1])
    return out


def run(
    max_ps: int = 4,
    max_workers: int = 8,
    max_tasks: int = 10,
    steps: int = 8,
    nodes: int = 3,
    node_cpus: int = 4,
    cores_per_task: float = 0.15,
    batch: int = 256,
    model: str = "mlp10m",
    say: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}: one of {', '.join(MODELS)}")
    cores = os.cpu_count() or 1
    if max_tasks * cores_per_task >= cores:
        raise ValueError(
            f"the largest shape's {max_tasks} tasks at {cores_per_task} cores each would use "
            f"{max_tasks * cores_per_task:g} of this machine's {cores} cores: every shape's speed would be a share "
            "of a contended machine; "
            "lower the cores per task or the grid's largest shape"
        )
    import ray
    from ray.cluster_utils import Cluster

    shapes = grid_shapes(max_ps, max_workers, max_tasks)
    if max_tasks > nodes * node_cpus:
        raise ValueError(f"max_tasks {max_tasks} exceeds the cluster's {nodes * node_cpus} CPUs")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 0, "include_dashboard": False, "object_store_memory": NODE_OBJECT_STORE_BYTES},
    )
    job = None
    try:
        for _ in range(nodes):
            add_node(cluster, num_cpus=node_cpus)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, logging_level="ERROR")
        ray_nodes = [n for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU", 0) > 0]
        view = ClusterView(tuple(NodeView(n["NodeID"], Resources(cpu=n["Resources"]["CPU"])) for n in ray_nodes))
        job_view = JobView(id=JOB, speed=lambda p, w: 1.0, max_ps=max_ps, max_workers=max_workers)
        task = TaskResources(cpu=1.0, cpu_limit=cores_per_task)
        config = JobConfig(
            report_interval_s=3600.0,
            ps_resources=task,
            worker_resources=task,
            gns_every_steps=0,
            placement_timeout_s=120.0,
        )
        description, build = MODELS[model]
        program = build(batch)
        order = walk_order(shapes)
        passes = order + order[::-1]

        def placement_of(shape: tuple[int, int], current: dict[str, str]) -> dict[str, str]:
            result = place([job_view], {JOB: shape}, view, {JOB: current} if current else None, "locality")
            return result.placement[JOB]

        first = passes[0]
        job = JobController(program, config, *first, placement=placement_of(first, {}))
        runs: dict[tuple[int, int], list[float]] = {s: [] for s in shapes}
        nodes_spanned: dict[tuple[int, int], int] = {}
        t_start = time.perf_counter()
        for i, shape in enumerate(passes):
            placement = placement_of(shape, job.placement())
            if i > 0:
                job.rescale(*shape, placement=placement)
                job.prepare(timeout_s=120.0)
            job.run(max_steps=1)  # the new shape's first step (warm caches, attachments)
            t0 = time.perf_counter()
            job.run(max_steps=steps)
            speed = steps * batch / (time.perf_counter() - t0)
            runs[shape].append(speed)
            nodes_spanned[shape] = len(set(job.placement().values()))
            if say is not None:
                say(f"[{i + 1}/{len(passes)}] {shape_text(*shape)}: {speed:.1f} samples/s")
        grid = [
            {
                "ps": p,
                "workers": w,
                "samples_per_s": statistics.median(runs[(p, w)]),
                "runs": runs[(p, w)],
                "nodes": nodes_spanned[(p, w)],
            }
            for p, w in shapes
        ]
        best = max(grid, key=lambda g: g["samples_per_s"])
        return {
            "workload": {
                "model": f"{description}, sync",
                "model_name": model,
                "global_batch": batch,
                "steps_timed_per_pass": steps,
                "cluster": f"{nodes} Ray nodes x {node_cpus} CPUs (ray.cluster_utils.Cluster on one machine)",
                "object_store_bytes_per_node": NODE_OBJECT_STORE_BYTES,
                "cores_per_task": cores_per_task,
                "grid": {"max_ps": max_ps, "max_workers": max_workers, "max_tasks": max_tasks},
                "placement": "locality",
            },
            "grid": grid,
            "best": {"ps": best["ps"], "workers": best["workers"], "samples_per_s": best["samples_per_s"]},
            "duration_s": time.perf_counter() - t_start,
        }
    finally:
        if job is not None:
            job.shutdown()
        ray.shutdown()
        cluster.shutdown()

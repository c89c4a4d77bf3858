"""``ray_train``: Ray Train v2's elastic ``TorchTrainer`` resizing a DDP job.

``ScalingConfig(num_workers=(2, 4))``: Ray Train asks for up to 4 workers
and resizes the worker group when the cluster's nodes change, by stopping
every worker and starting the new group from the latest reported checkpoint
(Ray 2.60's documented elastic training). On this machine the cluster's
nodes are raylets of a ``ray.cluster_utils.Cluster``: the workers need a
``peers_train`` resource that only two 2-worker nodes have. Grow 2 -> 4: the
second node joins. Shrink 4 -> 2: the second node is removed (its workers
die, Ray Train restarts the group on what is left, ``FailureConfig``
allowing it). Ray Train's view of the nodes is refreshed every 20 s
(``AutoscalingCoordinator.TICK_INTERVAL_S``), so a restart soon after the
node left may ask for 4 workers again and wait out the worker group's 60 s
start timeout (``RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S``) before taking 2:
defaults kept, as a user gets them. Each worker trains the same DDP step as ``ddp_gloo`` and rank 0
reports a checkpoint every 16 steps.
"""

from __future__ import annotations

import dataclasses
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from elasticps.bench.peers.common import add_node
from elasticps.bench.peers.resize import Timeline, read_step_log, wait_for_workers
from elasticps.bench.peers.workloads import Workload

PER_NODE = 2
SLOT = "peers_train"
HOW = (
    "Ray Train v2 TorchTrainer, ScalingConfig(num_workers=(2, 4), elastic_resize_monitor_interval_s=1): "
    "grow = a 2-worker Ray node joins, shrink = it is removed; the worker group restarts from the latest "
    "checkpoint (reported every 16 steps). Ray Train sees nodes through a view refreshed every 20 s: after "
    "the node leaves, its restart may first ask for 4 workers and wait out its 60 s worker-group start timeout"
)


def available() -> str | None:
    """None if Ray Train can run here, else why not (the ``peers`` extra is missing)."""
    try:
        import ray.train.torch  # noqa: F401
    except ImportError as exc:
        return f"ray[train] is not installed (pip install 'elasticps[peers]'): {exc}"
    return None


def _train_loop(config: dict[str, Any]) -> None:
    import ray.train
    import ray.train.torch
    import torch
    import torch.distributed as dist

    from elasticps.bench.peers.resize import log_step
    from elasticps.bench.peers.torchrun_train import resume, save
    from elasticps.bench.peers.workloads import DataParallelStep
    from elasticps.bench.peers.workloads import Workload as _Workload

    torch.set_num_threads(config["threads"])
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    program = _Workload(**config["workload"]).program()
    stepper = DataParallelStep(program, program.build_dataset())
    model = ray.train.torch.prepare_model(program.build_model())
    opt = program.make_optimizer(list(model.parameters()))
    step = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            step = resume(Path(d) / "state.pt", model.module, opt)
    stop = Path(config["dir"]) / "stop"
    log = (Path(config["dir"]) / "steps.txt").open("a") if rank == 0 else None
    while True:
        loss = stepper.train(model, opt, step, rank, world)
        step += 1
        if log is not None:
            log_step(log, step - 1, world, loss)
        if step % config["checkpoint_every"] == 0:
            with tempfile.TemporaryDirectory() as tmp:
                ckpt = None
                if rank == 0:
                    save(Path(tmp) / "state.pt", model.module, opt, step)
                    ckpt = ray.train.Checkpoint.from_directory(tmp)
                ray.train.report({"step": step}, checkpoint=ckpt)
            flag = torch.tensor([float(stop.exists())])
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            if flag.item() > 0:
                return


def resize(
    workload: Workload,
    sizes: tuple[int, ...],
    hold_s: float,
    threads: int = 1,
    say: Callable[[str], None] = lambda _: None,
    cluster: Any = None,
) -> Timeline:
    """``cluster``: the ``ray.cluster_utils.Cluster`` the driver is connected to."""
    if any(s % PER_NODE or s > 2 * PER_NODE for s in sizes):
        raise ValueError(f"Ray Train here runs 2 or 4 workers (1 or 2 nodes of {PER_NODE}), got {sizes}")
    if cluster is None:
        raise ValueError("Ray Train's resize needs the ray.cluster_utils.Cluster the driver runs on")
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    with tempfile.TemporaryDirectory(prefix="peers-raytrain-") as tmp:
        directory = Path(tmp)
        log = directory / "steps.txt"
        nodes = [add_node(cluster, num_cpus=PER_NODE, resources={SLOT: PER_NODE}) for _ in range(sizes[0] // PER_NODE)]
        trainer = TorchTrainer(
            _train_loop,
            train_loop_config={
                "workload": dataclasses.asdict(workload),
                "threads": threads,
                "dir": str(directory),
                "checkpoint_every": 16,
            },
            scaling_config=ScalingConfig(
                num_workers=(min(sizes), max(sizes)),
                resources_per_worker={"CPU": 1, SLOT: 1},
                elastic_resize_monitor_interval_s=1.0,
            ),
            run_config=RunConfig(
                name="peers",
                storage_path=str(directory / "storage"),
                failure_config=FailureConfig(max_failures=-1),
                checkpoint_config=CheckpointConfig(num_to_keep=2),
            ),
        )
        errors: list[BaseException] = []

        def fit() -> None:
            try:
                trainer.fit()
            except BaseException as exc:  # reported by the driver below
                errors.append(exc)

        thread = threading.Thread(target=fit, name="ray-train-fit", daemon=True)
        thread.start()
        changes: list[tuple[float, int]] = []
        try:
            wait_for_workers(log, sizes[0], 0.0, lambda: _check(errors), "Ray Train")
            for workers in sizes[1:]:
                time.sleep(hold_s)
                t_req = time.time()
                changes.append((t_req, workers))
                say(f"ray_train: {len(nodes)} -> {workers // PER_NODE} nodes")
                while len(nodes) < workers // PER_NODE:
                    nodes.append(add_node(cluster, num_cpus=PER_NODE, resources={SLOT: PER_NODE}))
                while len(nodes) > workers // PER_NODE:
                    cluster.remove_node(nodes.pop())
                wait_for_workers(log, workers, t_req, lambda: _check(errors), "Ray Train")
            time.sleep(hold_s)
        finally:
            (directory / "stop").touch()
            thread.join(timeout=120)
            for node in nodes:
                cluster.remove_node(node)
        rows = read_step_log(log)
    timeline = Timeline.from_steps("ray_train", rows, workload.program().batch_size)
    timeline.changes, timeline.how = changes, HOW
    return timeline


def _check(errors: list[BaseException]) -> None:
    if errors:
        raise RuntimeError(f"Ray Train failed: {errors[0]!r}")

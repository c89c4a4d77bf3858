"""``ddp_gloo``: torch's DistributedDataParallel over gloo, one spawned process per worker.

What a user would write without any PS: W processes, each with the whole
model and optimizer, all-reducing gradients during backward. The same
model, global batches, optimizer and torch threads per process as the
runtime (see :class:`~elasticps.bench.peers.workloads.DataParallelStep`).
"""

from __future__ import annotations

import multiprocessing as mp
import queue as queue_mod
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from elasticps.bench.peak_rss import peak_mib
from elasticps.bench.peers.common import RunResult, comm_share, free_port, most
from elasticps.bench.peers.workloads import DataParallelStep, Workload

TIMEOUT_S = 600.0


def run(workload: Workload, workers: int, steps: int, warmup: int = 2, threads: int = 1) -> RunResult:
    """Train ``warmup + steps`` steps on ``workers`` processes; time the last ``steps``."""
    ctx = mp.get_context("spawn")
    results: Any = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_rank_main, args=(rank, workers, workload, steps, warmup, threads, port, results))
        for rank in range(workers)
    ]
    for p in procs:
        p.start()
    try:
        outs = [_get(results, procs) for _ in range(workers)]
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    outs.sort(key=lambda o: o["rank"])
    m = workload.program().batch_size
    losses = [sum(o["loss_sums"][i] for o in outs) / m for i in range(warmup + steps)]
    head = outs[0]
    step_s = head["elapsed_s"] / steps
    compute_s = head["local_fb_s"] + head["opt_s"]
    return RunResult(
        "ddp_gloo",
        steps * m / head["elapsed_s"],
        comm_share(step_s, compute_s),
        losses,
        {"step_s": step_s, "local_forward_backward_s": head["local_fb_s"], "optimizer_s": head["opt_s"]},
        worker_peak_mib=most([o["peak_mib"] for o in outs]),
    )


def _get(results: Any, procs: list[Any]) -> dict[str, Any]:
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            out = results.get(timeout=1.0)
        except queue_mod.Empty:
            if any(p.exitcode not in (None, 0) for p in procs):
                raise RuntimeError(f"a DDP rank failed (exit codes {[p.exitcode for p in procs]})") from None
            continue
        if "error" in out:
            raise RuntimeError(f"DDP rank {out['rank']}: {out['error']}")
        return out
    raise TimeoutError(f"DDP ranks gave no result in {TIMEOUT_S:.0f} s")


def _rank_main(
    rank: int, world: int, workload: Workload, steps: int, warmup: int, threads: int, port: int, results: Any
) -> None:
    try:
        results.put(_train(rank, world, workload, steps, warmup, threads, port))
    except Exception as exc:
        results.put({"rank": rank, "error": f"{type(exc).__name__}: {exc}"})
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _train(rank: int, world: int, workload: Workload, steps: int, warmup: int, threads: int, port: int) -> dict:
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    program = workload.program()
    stepper = DataParallelStep(program, program.build_dataset())
    model = DistributedDataParallel(program.build_model())
    opt = program.make_optimizer(list(model.parameters()))
    loss_sums: list[float] = []
    opt_times: list[float] = []
    t_start = 0.0
    for step in range(warmup + steps):
        if step == warmup:
            dist.barrier()
            t_start = time.perf_counter()
        batch = stepper.local_batch(step, rank, world)
        opt.zero_grad(set_to_none=False)
        loss_sums.append(stepper.forward_backward(model, batch, world))
        t0 = time.perf_counter()
        opt.step()
        opt_times.append(time.perf_counter() - t0)
    dist.barrier()
    elapsed = time.perf_counter() - t_start
    # the same forward/backward without the all-reduce: the step's compute alone
    local = []
    for step in range(min(steps, 4)):
        batch = stepper.local_batch(step, rank, world)
        opt.zero_grad(set_to_none=False)
        t0 = time.perf_counter()
        with model.no_sync():
            stepper.forward_backward(model, batch, world)
        local.append(time.perf_counter() - t0)
    dist.barrier()
    return {
        "rank": rank,
        "loss_sums": loss_sums,
        "elapsed_s": elapsed,
        "local_fb_s": statistics.median(local),
        "opt_s": statistics.median(opt_times[warmup:]),
        "peak_mib": peak_mib(),
    }

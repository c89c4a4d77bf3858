"""``plain_ps``: a parameter server the way Ray's tutorial builds one.

One ``ParameterServer`` actor holds the whole model and its optimizer; each
``DataWorker`` actor gets the weights (a list of numpy arrays, through Ray's
object store), computes the gradient of its slice of the global batch and
returns it as numpy arrays; the server sums them, steps the optimizer and
returns the new weights. The driver submits step t+1's gradients on step t's
weights ref, as the tutorial's synchronous loop does. Same model, batches,
optimizer, threads and CPUs per task as the runtime.
"""

from __future__ import annotations

import time
import warnings

import numpy as np
import ray
import torch

from elasticps.bench.peak_rss import peak_mib
from elasticps.bench.peers.common import RunResult, comm_share, most
from elasticps.bench.peers.workloads import DataParallelStep, Workload


@ray.remote(num_cpus=1)
class ParameterServer:
    def __init__(self, workload: Workload, threads: int) -> None:
        torch.set_num_threads(threads)
        program = workload.program()
        self.model = program.build_model()
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.opt = program.make_optimizer(self.params)
        self.update_s: list[float] = []

    def get_weights(self) -> list[np.ndarray]:
        return [p.detach().numpy() for p in self.params]

    def apply_gradients(self, *gradients: list[np.ndarray]) -> list[np.ndarray]:
        t0 = time.perf_counter()
        summed = [np.sum(parts, axis=0) for parts in zip(*gradients, strict=True)]
        for p, g in zip(self.params, summed, strict=True):
            p.grad = torch.from_numpy(g)
        self.opt.step()
        self.update_s.append(time.perf_counter() - t0)
        return self.get_weights()

    def timings(self) -> list[float]:
        return self.update_s

    def peak_mib(self) -> float | None:
        return peak_mib()


@ray.remote(num_cpus=1)
class DataWorker:
    def __init__(self, workload: Workload, rank: int, world: int, threads: int) -> None:
        torch.set_num_threads(threads)
        program = workload.program()
        self.model = program.build_model()
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.stepper = DataParallelStep(program, program.build_dataset())
        self.rank, self.world = rank, world
        self.compute_s: list[float] = []

    def compute_gradients(self, weights: list[np.ndarray], step: int) -> tuple[list[np.ndarray], float]:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # read-only arrays from the object store: only read
            for p, w in zip(self.params, weights, strict=True):
                p.copy_(torch.from_numpy(w))
        batch = self.stepper.local_batch(step, self.rank, self.world)
        self.model.zero_grad(set_to_none=False)
        t0 = time.perf_counter()
        # the mean over the world's ranks is the server's sum divided by world
        loss_sum = self.stepper.forward_backward(self.model, batch, 1)
        self.compute_s.append(time.perf_counter() - t0)
        return [p.grad.numpy().copy() for p in self.params], loss_sum

    def timings(self) -> list[float]:
        return self.compute_s

    def peak_mib(self) -> float | None:
        return peak_mib()


def run(workload: Workload, workers: int, steps: int, warmup: int = 2, threads: int = 1) -> RunResult:
    ps = ParameterServer.remote(workload, threads)
    pool = [DataWorker.remote(workload, r, workers, threads) for r in range(workers)]
    try:
        weights = ps.get_weights.remote()
        ray.get([w.timings.remote() for w in pool] + [weights])  # every actor up
        losses: list[float] = []
        m = workload.program().batch_size
        t_start = time.perf_counter()
        for step in range(warmup + steps):
            if step == warmup:
                ray.get(weights)
                t_start = time.perf_counter()
            calls = [w.compute_gradients.options(num_returns=2).remote(weights, step) for w in pool]
            weights = ps.apply_gradients.remote(*[grads for grads, _ in calls])
            losses.append(sum(ray.get([loss for _, loss in calls])) / m)
        ray.get(weights)
        elapsed = time.perf_counter() - t_start
        compute = ray.get([w.timings.remote() for w in pool])
        update = ray.get(ps.timings.remote())
        worker_peaks = ray.get([w.peak_mib.remote() for w in pool])
        ps_peak = ray.get(ps.peak_mib.remote())
    finally:
        for actor in [ps, *pool]:
            ray.kill(actor)
    step_s = elapsed / steps
    compute_s = float(np.median([max(c[i] for c in compute) for i in range(warmup, warmup + steps)]))
    update_s = float(np.median(update[warmup:]))
    return RunResult(
        "plain_ps",
        steps * m / elapsed,
        comm_share(step_s, compute_s + update_s),
        losses,
        {"step_s": step_s, "forward_backward_s": compute_s, "update_s": update_s},
        worker_peak_mib=most(worker_peaks),
        ps_peak_mib=ps_peak,
    )

"""A worker: pulls parameters, computes the gradient of its samples, returns it."""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np
import ray
import torch

from elasticps.program import TrainingProgram
from elasticps.runtime.config import DEFAULT_STEP_TIMEOUT_S
from elasticps.runtime.data import fetch_batch, forward, rows
from elasticps.runtime.flat import FlatModel
from elasticps.runtime.shm import Attachments, OwnedVector, available
from elasticps.runtime.worker_base import WorkerBase


class Worker(WorkerBase):
    """Computes gradients for the samples the controller hands it.

    :meth:`step` returns ``1 + num_shards`` values: a dict of statistics, then
    the gradient slice for each PS shard. The controller owns those values and
    forwards them to the shards, so a worker that dies after returning loses
    nothing.
    """

    def __init__(
        self,
        program: TrainingProgram,
        threads: int = 1,
        shared_memory: bool = True,
        cpu_limit: float | None = None,
        dataset: Any = None,
        wait_s: float = DEFAULT_STEP_TIMEOUT_S,
    ) -> None:
        """``dataset``: the training set, already built (None: build it from the program);
        ``wait_s``: see :class:`WorkerBase`."""
        super().__init__(threads, cpu_limit, wait_s)
        self.program = program
        model = program.build_model()
        numel = sum(p.numel() for p in model.parameters() if p.requires_grad)
        self._grad_shm = OwnedVector("grad", numel) if shared_memory and available() else None
        self.flat = FlatModel(model, None if self._grad_shm is None else self._grad_shm.array)
        self.dataset = dataset if dataset is not None else program.build_dataset()

    def park(self) -> None:
        """Waiting as a standby (:mod:`~elasticps.runtime.standby`): let go of
        what it holds of other tasks, the mappings of the shards' parameters
        (shards that may be gone since) and a batch read ahead."""
        self.flat.unbind()
        self._attached = Attachments()
        self._next = None

    def ready(self) -> dict[str, Any]:
        return {"node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}

    def step(
        self,
        step: int,
        indices: np.ndarray,
        param_refs: list[ray.ObjectRef],
        bounds: list[tuple[int, int]],
        denominator: int,
        seed: int,
        measure: bool = True,
        same_node: list[bool] | None = None,
        prefetch: np.ndarray | None = None,
    ) -> tuple[Any, ...]:
        """Gradient of ``sum(loss over indices) / denominator`` at the pulled parameters.

        With ``measure``, the local batch is processed as two halves so that the
        squared norms of the half-batch and local-batch mean gradients come
        almost for free; with the global one they estimate the noise scale.
        For shards marked ``same_node``, the gradient is handed over as a
        :class:`ShmRef` into this worker's shared buffer instead of a copy.
        ``prefetch``: the samples this worker will most likely get next (the
        same shape and batch): read in the background meanwhile, and used if
        they are indeed asked for.
        """
        batch, prefetched = self._samples(indices, prefetch, lambda idx: fetch_batch(self.dataset, idx))
        assert batch is not None
        t0 = time.perf_counter()
        parts = self._pull(param_refs)
        self.flat.bind(parts, bounds)
        t1 = time.perf_counter()

        with self.cpu_limit.held():
            loss_sum, sq_half, sq_local, b, half = self._gradient(
                batch.result(), len(indices), denominator, seed, measure
            )
        t2 = time.perf_counter()
        slices = self._handoff(self.flat.grads_numpy(), bounds, same_node)
        stats = {
            "step": step,
            "samples": b,
            "loss_sum": loss_sum,
            "pull_s": t1 - t0,
            "compute_s": t2 - t1,
            "batch_half": half,
            "sqnorm_half": sq_half,
            "sqnorm_local": sq_local,
            **self._transfer_stats(parts, slices, prefetched),
        }
        return (stats, *slices)

    def _gradient(
        self, batch: tuple[Any, Any], b: int, denominator: int, seed: int, measure: bool
    ) -> tuple[float, float, float, int, int]:
        """Accumulate the gradient of ``batch`` (inputs, targets; ``b`` samples)
        into the flat buffer; returns the loss sum, the half- and local-batch
        squared norms, the batch and its half."""
        torch.manual_seed(seed)
        x, y = batch
        half = b // 2 if measure else 0
        grads = self.flat.grads
        grads.zero_()
        model = self.flat.model
        model.train()
        loss_sum = 0.0
        sq_half = float("nan")
        for lo, hi in ((0, half), (half, b)) if half > 0 else ((0, b),):
            out = forward(model, rows(x, lo, hi))
            loss = self.program.loss(out, rows(y, lo, hi))
            (loss * ((hi - lo) / denominator)).backward()
            loss_sum += float(loss.detach()) * (hi - lo)
            if hi == half:
                sq_half = float(torch.dot(grads, grads)) * (denominator / half) ** 2
        sq_local = float(torch.dot(grads, grads)) * (denominator / b) ** 2 if measure else float("nan")
        return loss_sum, sq_half, sq_local, b, half

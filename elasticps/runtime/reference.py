"""Single-process training with the same data order: the yardstick for ``sync`` mode."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from elasticps.program import TrainingProgram
from elasticps.runtime.data import DataPosition, GlobalBatches, fetch_batch, forward
from elasticps.runtime.flat import flat_params


@dataclass
class ReferenceResult:
    params: np.ndarray
    steps: int
    samples: int
    elapsed_s: float
    losses: list[float]

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.elapsed_s if self.elapsed_s > 0 else float("nan")


def train_single_process(
    program: TrainingProgram,
    max_steps: int | None = None,
    threads: int | None = None,
    skip_steps: int = 0,
    batch_schedule: Callable[[int], int] | None = None,
    epoch_end: Callable[[int, torch.nn.Module], bool] | None = None,
) -> ReferenceResult:
    """Plain PyTorch training (model, ``torch.optim``, one process), step for step
    the same global batches as the runtime, with the learning rate of
    :meth:`TrainingProgram.lr_at`. ``batch_schedule(step)``: the global batch of
    each step (the program's ``batch_size`` by default). Times only the steps
    after ``skip_steps``. ``epoch_end(epochs_done, model)`` runs after the step
    that ends each epoch; training stops when it returns True."""
    if threads is not None:
        torch.set_num_threads(threads)
    model = program.build_model()
    opt = program.make_optimizer(list(p for p in model.parameters() if p.requires_grad))
    dataset = program.build_dataset()
    batches = GlobalBatches(program.seed, len(dataset), program.batch_size)
    pos = DataPosition(0, 0)
    steps = samples = 0
    losses: list[float] = []
    t0 = time.perf_counter()
    model.train()
    while pos.epoch < program.epochs and (max_steps is None or steps < max_steps):
        if steps == skip_steps:
            t0, samples = time.perf_counter(), 0
        batch = program.batch_size if batch_schedule is None else batch_schedule(steps)
        epoch = pos.epoch
        idx, pos = batches.take(pos, batch)
        x, y = fetch_batch(dataset, idx)
        for group in opt.param_groups:
            group["lr"] = program.lr_at(steps, batch)
        opt.zero_grad()
        loss = program.loss(forward(model, x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        steps += 1
        samples += len(idx)
        if epoch_end is not None and pos.epoch != epoch:
            stop = epoch_end(pos.epoch, model)
            model.train()
            if stop:
                break
    return ReferenceResult(flat_params(model), steps, samples, time.perf_counter() - t0, losses)


def relative_error(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| / max |b|: the exactness measure of sync training."""
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))

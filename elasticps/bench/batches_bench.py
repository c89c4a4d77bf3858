"""``elasticps bench batches``: what a bigger batch costs in samples, measured.

The goodput objective trades samples/s against statistical efficiency E(M):
past the gradient noise scale a bigger batch needs more samples to reach the
same model. This trains the demo's CNN on digits single-process (the runtime's
data order and learning-rate rule, no Ray) at each fixed global batch, for each
seed, and reports the epochs and steps until held-out accuracy first reaches
the target: the ground truth the noise-scale model estimates.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from elasticps.examples import digits
from elasticps.runtime.reference import train_single_process


def epochs_to_target(batch: int, seed: int, target: float, lr: float, max_epochs: int) -> tuple[int | None, int | None]:
    """(epochs, steps) until the test accuracy first reached ``target`` training
    at global batch ``batch`` throughout (None, None: not within ``max_epochs``)."""
    program = digits.cnn_program(epochs=max_epochs, batch_size=128, seed=seed, max_batch_size=max(batch, 128), lr=lr)
    x_test, y_test = digits.test_set().tensors
    reached: list[int] = []

    def epoch_end(epochs: int, model: torch.nn.Module) -> bool:
        model.eval()
        with torch.no_grad():
            if digits.accuracy(model(x_test), y_test) >= target:
                reached.append(epochs)
        return bool(reached)

    result = train_single_process(program, batch_schedule=lambda step: batch, epoch_end=epoch_end)
    return (reached[0], result.steps) if reached else (None, None)


def run(
    batches: list[int],
    seeds: int = 3,
    target: float = 0.98,
    lr: float = 0.02,
    max_epochs: int = 80,
    say: Callable[[str], None] = lambda line: None,
) -> dict[str, Any]:
    """Every batch x seed; per batch the runs and the median epochs and steps."""
    if not batches or min(batches) < 1:
        raise ValueError(f"batches must be positive, got {batches}")
    if not 0.0 < target <= 1.0:
        raise ValueError(f"target is an accuracy, 0..1, got {target:g}")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same arithmetic on any machine: results depend on batch and seed only
    started = time.perf_counter()
    rows: dict[str, Any] = {}
    try:
        for batch in batches:
            rows[str(batch)] = _one_batch(batch, seeds, target, lr, max_epochs, say)
    finally:
        torch.set_num_threads(threads)
    return {
        "workload": "digits CNN (elasticps.examples.digits:cnn_program), SGD momentum 0.9, square-root lr scaling",
        "lr_at_batch_128": lr,
        "target_accuracy": target,
        "max_epochs": max_epochs,
        "batches": rows,
        "elapsed_s": round(time.perf_counter() - started, 1),
    }


def _one_batch(
    batch: int, seeds: int, target: float, lr: float, max_epochs: int, say: Callable[[str], None]
) -> dict[str, Any]:
    runs = []
    for seed in range(seeds):
        epochs, steps = epochs_to_target(batch, seed, target, lr, max_epochs)
        runs.append({"seed": seed, "epochs": epochs, "steps": steps})
        say(f"batch {batch}, seed {seed}: {epochs if epochs is not None else 'never'} epochs to {target:g}")
    reached = [r for r in runs if r["epochs"] is not None]
    return {
        "runs": runs,
        "reached": len(reached),
        "median_epochs": statistics.median(r["epochs"] for r in reached) if reached else None,
        "median_steps": statistics.median(r["steps"] for r in reached) if reached else None,
    }

"""The workloads every system trains, by name, and the DDP step they share.

A workload is rebuilt from its name, size and table rows in every process
(spawned DDP ranks and Ray actors receive the :class:`Workload`; torchrun's
and Ray Train's workers its fields), so that no system gets a different
model, data set, batch or optimizer. ``small=True`` gives the same kinds of model at
a size a smoke test can train in seconds.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from elasticps.examples import embedding, synthetic, transformer
from elasticps.program import TrainingProgram
from elasticps.runtime.data import DataPosition, GlobalBatches, fetch_batch, forward, split_evenly

GLOBAL_BATCH = 256
NAMES = ("dense_mlp_10m", "transformer", "embedding")
#: The embedding workload's table rows (16 floats each): 61 MiB, less than a worker's own footprint.
EMBEDDING_ROWS = 1_000_000


@dataclass(frozen=True)
class Workload:
    name: str
    small: bool = False
    #: the embedding table's rows (``small``: 5,000 whatever this says)
    rows: int = EMBEDDING_ROWS

    def program(self) -> TrainingProgram:
        if self.name not in NAMES:
            raise ValueError(f"unknown workload {self.name!r}; choose from {', '.join(NAMES)}")
        batch = 32 if self.small else GLOBAL_BATCH
        if self.name == "dense_mlp_10m":
            if self.small:
                return _tiny_mlp(batch)
            return synthetic.program(batch_size=batch, epochs=10_000, num_samples=16 * batch)
        if self.name == "transformer":
            width, layers = (32, 1) if self.small else (128, 2)
            return transformer.program(
                epochs=10_000, batch_size=batch, samples=16 * batch, width=width, layers=layers, heads=4
            )
        return embedding.program(**self._embedding_args())

    def _embedding_args(self) -> dict[str, Any]:
        batch = 32 if self.small else GLOBAL_BATCH
        rows = 5_000 if self.small else self.rows
        return {"rows": rows, "batch_size": batch, "samples": 64 * batch, "epochs": 10_000, "lr": 0.01}

    def ps_table_loop(self) -> Callable[..., Any] | None:
        """The same training as a user's loop whose table the PS holds
        (``elasticps.torch.Embedding``), or None if the workload has no table."""
        if self.name != "embedding":
            return None
        return functools.partial(embedding.loop, **self._embedding_args())

    def table_mib(self) -> float | None:
        """The size of the workload's embedding table, or None if it has none."""
        if self.name != "embedding":
            return None
        args = self._embedding_args()
        return args["rows"] * embedding.DIM * 4 / 2**20

    def describe(self) -> str:
        p = self.program()
        params = sum(t.numel() for t in p.build_model().parameters())
        return f"{p.name}: {params / 1e6:.2f}M float32 parameters, {p.optimizer_name}, global batch {p.batch_size}"


def _tiny_mlp(batch: int) -> TrainingProgram:
    from torch import nn
    from torch.utils.data import TensorDataset

    def data() -> TensorDataset:
        g = torch.Generator().manual_seed(7)
        x = torch.randn(16 * batch, 32, generator=g)
        return TensorDataset(x, torch.tanh(x[:, :8] * 2))

    return TrainingProgram(
        name="tiny-mlp",
        model=lambda: nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8)),
        dataset=data,
        loss=nn.functional.mse_loss,
        optimizer="adam",
        lr=1e-2,
        batch_size=batch,
        epochs=10_000,
    )


def position_at(step: int, batch: int, num_samples: int) -> DataPosition:
    """The data position before ``step`` (the data set holds whole batches)."""
    done = step * batch
    return DataPosition(done // num_samples, done % num_samples)


class DataParallelStep:
    """One data-parallel step on one rank, the same global batches as the runtime.

    Rank ``r`` of ``world`` takes the ``r``-th slice of step ``t``'s global
    batch and scales its mean loss by ``slice * world / M``: DDP averages the
    ranks' gradients, so the result is the global-batch mean gradient for
    uneven slices too, as in the runtime.
    """

    def __init__(self, program: TrainingProgram, dataset: Any) -> None:
        self.program = program
        self.dataset = dataset
        self.batches = GlobalBatches(program.seed, len(dataset), program.batch_size)

    def local_batch(self, step: int, rank: int, world: int) -> tuple[Any, Any, int]:
        m = self.program.batch_size
        idx, _ = self.batches.take(position_at(step, m, len(self.dataset)), m)
        part = split_evenly(idx, world)[rank]
        x, y = fetch_batch(self.dataset, part)
        return x, y, len(part)

    def forward_backward(self, model: torch.nn.Module, batch: tuple[Any, Any, int], world: int) -> float:
        """Backward of the scaled loss; returns this rank's loss sum."""
        x, y, b = batch
        loss = self.program.loss(forward(model, x), y)
        (loss * (b * world / self.program.batch_size)).backward()
        return float(loss.detach()) * b

    def train(self, model: torch.nn.Module, opt: torch.optim.Optimizer, step: int, rank: int, world: int) -> float:
        """Step ``step`` on this rank, the optimizer's update included; returns the rank's mean loss."""
        batch = self.local_batch(step, rank, world)
        opt.zero_grad(set_to_none=False)
        loss_sum = self.forward_backward(model, batch, world)
        opt.step()
        return loss_sum / batch[2]

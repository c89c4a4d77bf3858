"""Data order and batches: one global order, independent of the job's shape.

The order of epoch ``e`` is a permutation drawn from ``(seed, e)``; the global
batch at data position ``(epoch, cursor)`` is ``order[cursor:cursor + M]``.
Workers get contiguous, nearly equal slices of it. Hence the position
``(epoch, cursor)`` alone says where training is, for any number of workers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


def epoch_order(seed: int, epoch: int, num_samples: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch]).permutation(num_samples)


def split_evenly(items: np.ndarray, parts: int) -> list[np.ndarray]:
    """Contiguous slices whose sizes differ by at most one (earlier ones larger)."""
    return [np.asarray(p) for p in np.array_split(items, parts)]


@dataclass(frozen=True)
class DataPosition:
    """Where training stands: ``cursor`` samples of epoch ``epoch`` consumed."""

    epoch: int
    cursor: int


class GlobalBatches:
    """Yields global batches of indices from a data position."""

    def __init__(self, seed: int, num_samples: int, batch_size: int) -> None:
        self.seed = seed
        self.num_samples = num_samples
        self.batch_size = batch_size
        self._orders: dict[int, np.ndarray] = {}

    def order(self, epoch: int) -> np.ndarray:
        if epoch not in self._orders:
            self._orders = {epoch: epoch_order(self.seed, epoch, self.num_samples)}
        return self._orders[epoch]

    def take(self, pos: DataPosition, count: int) -> tuple[np.ndarray, DataPosition]:
        """The next ``count`` indices (fewer at the end of an epoch) and the new position."""
        end = min(pos.cursor + count, self.num_samples)
        idx = self.order(pos.epoch)[pos.cursor : end]
        if end >= self.num_samples:
            return idx, DataPosition(pos.epoch + 1, 0)
        return idx, DataPosition(pos.epoch, end)

    def steps_per_epoch(self) -> int:
        return -(-self.num_samples // self.batch_size)


def fetch_batch(dataset: Any, indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets of ``indices``, stacked; vectorised for TensorDataset."""
    tensors = getattr(dataset, "tensors", None)
    if tensors is not None and len(tensors) == 2:
        index = torch.from_numpy(np.array(indices, dtype=np.int64))
        return tensors[0][index], tensors[1][index]
    pairs = [dataset[int(i)] for i in indices]
    xs = torch.stack([torch.as_tensor(p[0]) for p in pairs])
    ys = torch.stack([torch.as_tensor(p[1]) for p in pairs])
    return xs, ys

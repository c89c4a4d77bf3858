"""Data order and batches: one global order, independent of the job's shape.

The order of epoch ``e`` is a permutation drawn from ``(seed, e)``; the global
batch at data position ``(epoch, cursor)`` is ``order[cursor:cursor + M]``.
Workers get contiguous, nearly equal slices of it. Hence the position
``(epoch, cursor)`` alone says where training is, for any number of workers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import default_collate

from elasticps.errors import ProgramError


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

    def __init__(self, seed: int, num_samples: int, batch_size: int, shuffle: bool = True) -> None:
        self.seed = seed
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.shuffle = shuffle  # False: every epoch in the dataset's order
        self._orders: dict[int, np.ndarray] = {}

    def order(self, epoch: int) -> np.ndarray:
        if epoch not in self._orders:
            order = epoch_order(self.seed, epoch, self.num_samples) if self.shuffle else np.arange(self.num_samples)
            self._orders = {epoch: order}
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


def read_samples(dataset: Any, indices: np.ndarray, collate_fn: Callable[[list[Any]], Any] | None = None) -> Any:
    """The samples ``indices`` of ``dataset``, batched as a DataLoader batches
    them: a TensorDataset by indexing its tensors at once (a list, one batch per
    tensor), a dataset with ``__getitems__(indices)`` (torch's batched read,
    e.g. from a file or a database) in one call, any other sample by sample;
    collated by ``collate_fn`` (torch's ``default_collate`` by default). Both
    kinds of worker, and the single-process runs they are held to, read through it."""
    tensors = getattr(dataset, "tensors", None)
    if tensors is not None and collate_fn is None:
        index = torch.from_numpy(np.array(indices, dtype=np.int64))
        return [t[index] for t in tensors]
    getitems = getattr(dataset, "__getitems__", None)  # torch's batched read: one call per batch
    items = getitems([int(i) for i in indices]) if getitems else [dataset[int(i)] for i in indices]
    return (collate_fn or default_collate)(items)


def fetch_batch(dataset: Any, indices: np.ndarray) -> tuple[Any, Any]:
    """Inputs and targets of ``indices`` (:func:`read_samples`) for a
    :class:`TrainingProgram`, whose samples are ``(input, target)``; either
    may be a tensor (or number), a tuple of them or a dict of them: a dict
    input is passed to the model as keyword arguments, a tuple as positional
    ones (see :func:`forward`)."""
    batch = read_samples(dataset, indices)
    if not (isinstance(batch, (tuple, list)) and len(batch) == 2):
        got = f"{len(batch)} items" if isinstance(batch, (tuple, list)) else type(batch).__name__
        raise ProgramError(f"a dataset sample must be (input, target), got {got}")
    return batch[0], batch[1]


def rows(batch: Any, lo: int, hi: int) -> Any:
    """Samples ``lo:hi`` of a batch (a tensor, or a tuple or dict of them)."""
    if isinstance(batch, dict):
        return {k: rows(v, lo, hi) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(rows(v, lo, hi) for v in batch)
    return batch[lo:hi]


def forward(model: torch.nn.Module, inputs: Any) -> Any:
    """``model(**inputs)`` for a dict, ``model(*inputs)`` for a tuple, else ``model(inputs)``."""
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)

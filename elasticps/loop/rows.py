"""Embedding tables that the PS shards hold and no worker does: what crosses between them.

A table the user marks (:class:`elasticps.torch.Embedding`) stays in the flat
parameter vector that the shards hold, so re-sharding, checkpoints, optimizer
state and recovery treat it as any other parameter. A worker holds only the
*dense* part of the vector (every element outside a table, in flat order):

- a shard's pull is the dense elements of its range, :class:`DenseSlice`; a
  shard's range ``[lo, hi)`` is the worker's ``[dense(lo), dense(hi))``;
- a batch's rows are read from the shards that hold them (:func:`read_rows`);
- a worker's push to a shard is its dense gradient slice and the gradient of
  the rows it read that the shard holds (:class:`RowPush`); the shard sums the
  dense slices, spreads them over its range with zeros in the tables, and adds
  each worker's rows (:func:`sum_pushes`), so the optimizer sees the gradient a
  worker holding the whole table would have pushed, and updates as it does.

Row ``r`` of a table at flat offset ``lo`` with ``dim`` columns is the
elements ``lo + r*dim .. lo + (r+1)*dim``; a shard's range may cut a row, so
each shard reads and updates the part of a row it holds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Table:
    lo: int  # its first element in the flat vector
    rows: int
    dim: int

    @property
    def hi(self) -> int:
        return self.lo + self.rows * self.dim

    @property
    def nbytes(self) -> int:
        return 4 * self.rows * self.dim

    def elements(self, ids: np.ndarray, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """Of rows ``ids``: the positions (from ``lo``) of their elements in ``[lo, hi)``,
        and which elements of the ``(len(ids), dim)`` rows those are."""
        flat = self.lo + np.asarray(ids, dtype=np.int64)[:, None] * self.dim + np.arange(self.dim)
        inside = (flat >= lo) & (flat < hi)
        return flat[inside] - lo, inside

    def touches(self, ids: np.ndarray, lo: int, hi: int) -> np.ndarray:
        """Which of rows ``ids`` have an element in ``[lo, hi)``."""
        start = self.lo + np.asarray(ids, dtype=np.int64) * self.dim
        return (start < hi) & (start + self.dim > lo)


@dataclass(frozen=True)
class Tables:
    """The PS-held tables of a model, in flat order."""

    tables: tuple[Table, ...]

    def dense(self, x: int) -> int:
        """How many dense elements come before flat position ``x``."""
        return x - sum(min(max(x - t.lo, 0), t.hi - t.lo) for t in self.tables)

    def dense_bounds(self, bounds: list[tuple[int, int]]) -> list[tuple[int, int]]:
        return [(self.dense(lo), self.dense(hi)) for lo, hi in bounds]

    def runs(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """The dense runs of ``[lo, hi)``, as flat ``(start, end)``."""
        out, pos = [], lo
        for t in self.tables:
            if t.lo > pos and pos < hi:
                out.append((pos, min(t.lo, hi)))
            pos = max(pos, t.hi)
        if pos < hi:
            out.append((pos, hi))
        return out

    def compact(self, data: np.ndarray, lo: int) -> np.ndarray:
        """The dense elements of ``data`` = flat ``[lo, lo + len(data))``, a copy."""
        runs = self.runs(lo, lo + len(data))
        if not runs:
            return np.zeros(0, np.float32)
        return np.concatenate([data[a - lo : b - lo] for a, b in runs])

    def expand(self, dense: np.ndarray, lo: int, hi: int) -> np.ndarray:
        """Flat ``[lo, hi)`` with ``dense`` in its dense runs and zeros in the tables."""
        out = np.zeros(hi - lo, np.float32)
        pos = 0
        for a, b in self.runs(lo, hi):
            out[a - lo : b - lo] = dense[pos : pos + b - a]
            pos += b - a
        return out


@dataclass
class DenseSlice:
    """A shard's pull when a model has PS-held tables: the dense elements of
    its range, and the shard, which a worker asks for the rows of its batch."""

    params: np.ndarray
    shard: Any  # the shard's actor handle

    @property
    def nbytes(self) -> int:
        return int(self.params.nbytes)


@dataclass
class RowPush:
    """A worker's gradient for one shard: the dense slice (an array, or a
    shared-memory reference), and ``(table, row ids, gradient rows)`` of the
    rows it read of which the shard holds a part."""

    dense: Any
    rows: list[tuple[int, np.ndarray, np.ndarray]] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return int(self.dense.nbytes) + sum(ids.nbytes + g.nbytes for _, ids, g in self.rows)


def read_rows(data: np.ndarray, lo: int, table: Table, ids: np.ndarray) -> np.ndarray:
    """Rows ``ids`` of ``table`` as a shard holding ``data`` = flat ``[lo, ..)`` has
    them: its elements, zeros where another shard holds the rest of a row."""
    out = np.zeros((len(ids), table.dim), np.float32)
    pos, inside = table.elements(ids, lo, lo + len(data))
    out[inside] = data[pos]
    return out


def sum_pushes(
    tables: Tables, pushes: list[RowPush], resolve: Callable[[Any], np.ndarray], lo: int, hi: int
) -> np.ndarray:
    """The sum of the workers' gradients for flat ``[lo, hi)``, in the order given:
    their dense slices summed, then each worker's rows added where the shard holds them."""
    dense = [resolve(p.dense) for p in pushes]
    total = dense[0].copy()
    for d in dense[1:]:
        total += d
    full = tables.expand(total, lo, hi)
    for push in pushes:
        for t, ids, grads in push.rows:
            pos, inside = tables.tables[t].elements(ids, lo, hi)
            full[pos] += grads[inside]  # a worker's ids are distinct
    return full

"""``elasticps.torch.Embedding``: an embedding table that the PS shards hold and no worker does.

In one process (``python train.py``), in a describe run and in a
``TrainingProgram`` it is ``torch.nn.Embedding``. In a job's worker it
allocates nothing (its weight lives on torch's ``meta`` device); its forward
reads the rows of the batch's distinct ids from the shards that hold them, at
the step's parameters (:class:`RowClient`), and the prepared optimizer's
``step()`` pushes the gradient of those rows with the dense gradient
(:mod:`elasticps.loop.rows`). The shards update their whole range as one
process updates the whole table (a zero gradient where no batch touched a
row), so any optimizer a job runs exactly is exact here too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from elasticps.errors import ProgramError
from elasticps.loop import api
from elasticps.loop.rows import DenseSlice, RowPush, Table, Tables

#: The part of a step's time (``step_timeout_s``) that a read of a shard's rows
#: may wait: a worker finds a hung shard, and names it, before the step's time
#: runs out and the controller takes the worker itself for hung.
READ_SHARE = 0.5


class Embedding(torch.nn.Embedding):
    """``torch.nn.Embedding(num_embeddings, embedding_dim, padding_idx)`` whose
    table the PS shards hold in a job: a worker reads the rows its batch uses.
    ``max_norm``, ``scale_grad_by_freq`` and ``sparse`` are not supported (the
    first changes rows in the forward, the second weighs a worker's share by
    its own counts, the third is for one process's sparse optimizers)."""

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        padding_idx: int | None = None,
        max_norm: float | None = None,
        norm_type: float = 2.0,
        scale_grad_by_freq: bool = False,
        sparse: bool = False,
        _weight: torch.Tensor | None = None,
        _freeze: bool = False,
        device: Any = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        unsupported = refused_options(max_norm=max_norm, scale_grad_by_freq=scale_grad_by_freq, sparse=sparse)
        if unsupported:
            raise ProgramError(
                f"elasticps.torch.Embedding does not take {unsupported}: it takes num_embeddings, "
                "embedding_dim and padding_idx (use torch.nn.Embedding for a table each worker holds)"
            )
        if getattr(api.current(), "tables_on_ps", False):  # a worker: the values are the PS's
            _weight, device = None, "meta"
        super().__init__(
            num_embeddings,
            embedding_dim,
            padding_idx,
            norm_type=norm_type,
            _weight=_weight,
            _freeze=_freeze,
            device=device,
            dtype=dtype,
        )
        self.rows: RowClient | None = None  # set by a worker's prepare()

    def _apply(self, fn: Any, recurse: bool = True) -> Embedding:
        """``model.to(device)`` and the like leave a worker's table alone: it is on the PS."""
        if self.weight.device.type == "meta":
            return self
        return super()._apply(fn, recurse)

    def __getstate__(self) -> dict[str, Any]:
        """A copy (``copy.deepcopy``, pickle) of a worker's table is refused: it holds no values."""
        if self.weight.device.type == "meta":
            raise ProgramError(
                "a copy of a table the PS holds (copy.deepcopy of the model: an EMA, an AveragedModel?): a worker "
                "has no values of it to copy, and a copy reading the PS's rows would not be a copy; copy the "
                "dense layers only, or leave the table with the workers (torch.nn.Embedding; tables_on_ps's "
                "min_rows)"
            )
        return super().__getstate__()

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if self.rows is None:
            if self.weight.device.type == "meta":
                raise ProgramError(
                    "a table the PS holds was read before elasticps.torch.prepare(model, optimizer): in a job's "
                    "worker its rows come from the PS shards, which hold the model once it is prepared; use the "
                    "model after prepare"
                )
            return super().forward(input)
        return self.rows.lookup(self, input)


def refused_options(**given: Any) -> list[str]:
    """Which of torch's ``max_norm``, ``scale_grad_by_freq`` and ``sparse`` are set:
    a table the PS holds takes none of them (see :class:`Embedding`)."""
    return sorted(k for k in ("max_norm", "scale_grad_by_freq", "sparse") if given.get(k) not in (None, False))


def tables_of(model: torch.nn.Module) -> tuple[Tables | None, list[Embedding]]:
    """The PS-held tables of ``model`` (where each one's weight lies in the flat
    vector of its trainable parameters) and their modules; None if it has none.
    A table that does not train, or whose weight another module shares, is refused."""
    offsets, offset = {}, 0
    for p in model.parameters():
        if p.requires_grad:
            offsets[id(p)] = offset
            offset += p.numel()
    modules = [m for m in model.modules() if isinstance(m, Embedding)]
    frozen = [m for m in modules if id(m.weight) not in offsets]
    if frozen:
        raise ProgramError(
            "an elasticps.torch.Embedding whose weight does not train: the PS holds only trained "
            "parameters; use torch.nn.Embedding for a frozen table"
        )
    weights = {id(m.weight): m for m in modules}
    for name, module in model.named_modules(remove_duplicate=False):
        for pname, p in module.named_parameters(recurse=False):
            if id(p) in weights and module is not weights[id(p)]:
                also = f"{name}.{pname}" if name else pname
                raise ProgramError(
                    f"the weight of a table the PS holds is also {also} (tied weights): a worker has no "
                    "copy of the table for another layer to use; untie them, or keep the table with the workers "
                    "(torch.nn.Embedding)"
                )
    modules.sort(key=lambda m: offsets[id(m.weight)])
    tables = tuple(Table(offsets[id(m.weight)], m.num_embeddings, m.embedding_dim) for m in modules)
    return (Tables(tables) if tables else None), modules


class RowClient:
    """A worker's side of its PS-held tables: which shard holds what (from each
    pull), the rows read for the current batch, and their gradients."""

    def __init__(
        self,
        tables: Tables,
        modules: list[Embedding],
        first_params: Callable[[], None],
        wait_s: float,
    ) -> None:
        """``first_params()`` waits for the job's parameters, which a read before
        the loop's first batch needs (an evaluation before training); ``wait_s``:
        the job's ``step_timeout_s``, of which a read of a shard's rows may take
        ``READ_SHARE`` (a hung shard's read counts as lost)."""
        self.tables = tables
        self.wait_s = wait_s * READ_SHARE
        self.first_params = first_params
        self.index = {id(m): i for i, m in enumerate(modules)}
        self.param_ids = {id(m.weight) for m in modules}
        self.shards: list[tuple[Any, int, int]] = []  # (handle, lo, hi) of each shard
        self.step = 0  # the step whose parameters were pulled: rows are read at it
        self.read_bytes: list[int] = []  # per shard: the bytes of rows read since the pull
        self.lookups: list[tuple[int, torch.Tensor, torch.Tensor]] = []  # (table, ids, rows read) of this batch
        self.recording = False
        self.lost: BaseException | None = None  # a shard that could not be read (a step that cannot stand)
        for m in modules:
            m.rows = self

    def bind(
        self, parts: list[DenseSlice], bounds: list[tuple[int, int]], step: int
    ) -> tuple[list[Any], list[tuple[int, int]]]:
        """A pull's dense parameters (those of ``step``) and their bounds in the worker's dense vector."""
        self.shards = [(p.shard, lo, hi) for p, (lo, hi) in zip(parts, bounds, strict=True)]
        self.step = step
        self.read_bytes = [0] * len(parts)
        return [p.params for p in parts], self.tables.dense_bounds(bounds)

    def start_batch(self) -> None:
        self.lookups, self.recording = [], True

    def read(self, t: int, ids: np.ndarray) -> np.ndarray:
        """Rows ``ids`` of table ``t``: one call to each shard that holds a part of them."""
        import ray  # a worker's: Ray is running there

        from elasticps.runtime.bounded_get import get_within
        from elasticps.runtime.membership import task_name

        if not self.shards:  # no pull yet: which shards hold the table comes with the parameters
            self.first_params()
        table = self.tables.tables[t]
        out = np.zeros((len(ids), table.dim), np.float32)
        if self.lost is not None:  # the step will not stand: a hung shard costs the batch one wait, not one a read
            return out
        calls = []
        for j, (shard, lo, hi) in enumerate(self.shards):
            mine = table.touches(ids, lo, hi)
            if mine.any():
                calls.append((j, mine, shard.read_rows.remote(t, ids[mine], self.step)))
        if not calls:
            return out
        names, limit = [task_name("ps", j) for j, _, _ in calls], f"{READ_SHARE:g} of step_timeout_s"
        try:  # one wait for every shard's rows: two hung shards cost one wait, and are both named
            answers = get_within([ref for _, _, ref in calls], self.wait_s, f"the rows of table {t}", names, limit)
        except ray.exceptions.RayError as exc:  # a shard died or hung (named): the step will not stand
            self.lost = exc
            return out
        for (j, mine, _), rows in zip(calls, answers, strict=True):
            out[mine] += rows  # each element from the one shard that holds it, zeros from the others
            self.read_bytes[j] += 8 * int(mine.sum()) + rows.nbytes
        return out

    def lookup(self, module: Embedding, input: torch.Tensor) -> torch.Tensor:
        if input.dtype not in (torch.int64, torch.int32):  # as torch's embedding: no row is read for a float
            raise RuntimeError(
                "Expected tensor for argument #1 'indices' to have one of the following scalar types: Long, Int; "
                f"but got {input.type()} instead (an elasticps.torch.Embedding)"
            )
        ids, inverse = torch.unique(input.reshape(-1), return_inverse=True)
        if len(ids) and (int(ids[0]) < 0 or int(ids[-1]) >= module.num_embeddings):
            raise IndexError(f"index out of range in an elasticps.torch.Embedding of {module.num_embeddings} rows")
        t = self.index[id(module)]
        weight = torch.from_numpy(self.read(t, ids.numpy()))
        if self.recording and torch.is_grad_enabled():
            weight.requires_grad_(True)
            self.lookups.append((t, ids, weight))
        pad = None
        if module.padding_idx is not None:
            hit = (ids == module.padding_idx).nonzero()
            pad = int(hit[0, 0]) if len(hit) else None
        return F.embedding(inverse.view(input.shape), weight, pad)

    def take_grads(self, scale: float) -> list[tuple[int, np.ndarray, np.ndarray]]:
        """This batch's ``(table, distinct row ids, gradient rows)`` times ``scale``
        (the worker's share of the global batch, as its dense gradient)."""
        per_table: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        for t, ids, weight in self.lookups:
            if weight.grad is not None:
                per_table.setdefault(t, []).append((ids, weight.grad))
        self.lookups, self.recording = [], False
        out = []
        for t, parts in sorted(per_table.items()):
            ids, grads = parts[0]
            if len(parts) > 1:  # the table was read more than once: one row per id
                ids, where = torch.unique(torch.cat([i for i, _ in parts]), return_inverse=True)
                grads = torch.zeros(len(ids), grads.shape[1]).index_add_(0, where, torch.cat([g for _, g in parts]))
            if scale != 1.0:
                grads = grads * scale
            out.append((t, ids.numpy(), grads.numpy()))
        return out

    def pushes(
        self, dense: list[Any], grads: list[tuple[int, np.ndarray, np.ndarray]], bounds: list[tuple[int, int]]
    ) -> list[RowPush]:
        """One push per shard: its dense slice and the gradient rows it holds a part of."""
        out = []
        for d, (lo, hi) in zip(dense, bounds, strict=True):
            rows = []
            for t, ids, g in grads:
                mine = self.tables.tables[t].touches(ids, lo, hi)
                if mine.any():
                    rows.append((t, ids[mine], g[mine]))
            out.append(RowPush(d, rows))
        return out

    def take_lost(self) -> BaseException | None:
        lost, self.lost = self.lost, None
        return lost

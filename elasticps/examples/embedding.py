"""An embedding-heavy model: a large table of item vectors and a small MLP.

The shape of a click-through-rate model, where a parameter server is the
natural design: most parameters sit in one table and a step touches few of
its rows. A sample is a bag of ``BAG`` item ids out of ``rows`` (default 1M;
with 16-dim vectors 16M parameters, 64 MB); its label says whether the items'
hidden scores sum above zero, which the table has to learn. The model is
``EmbeddingBag(rows, dim, mode="mean")`` followed by a 64-64-1 MLP, trained
with binary cross-entropy and Adam.

The table's gradient is a dense tensor (``sparse=False``): the runtime moves
flat float32 vectors, and dense gradients are what DistributedDataParallel
all-reduces too, so every system moves the same bytes.

:func:`loop` is the same training as a user's loop whose table the PS
holds (``elasticps.torch.Embedding``, mean-pooled: ``EmbeddingBag``'s
parameters and initial values): a worker holds the MLP only, reads the rows
of its batch's ids and pushes their gradient.

``elasticps train elasticps.examples.embedding:program --ps 2 --workers 2``
``elasticps train elasticps.examples.embedding:loop --ps 2 --workers 2``
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

import elasticps.torch as ept
from elasticps.program import TrainingProgram

BAG = 8
DIM = 16


class BagClassifier(nn.Module):
    """``ps_table``: the table is an ``elasticps.torch.Embedding`` whose rows are
    averaged per bag, the same parameters drawn from the same generator as
    ``EmbeddingBag(mode="mean")``, and the same forward."""

    def __init__(self, rows: int, dim: int = DIM, hidden: int = 64, ps_table: bool = False) -> None:
        super().__init__()
        self.ps_table = ps_table
        self.table = ept.Embedding(rows, dim) if ps_table else nn.EmbeddingBag(rows, dim, mode="mean")
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())
        self.out = nn.Linear(hidden, 1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        bags = self.table(ids).mean(1) if self.ps_table else self.table(ids)
        return self.out(self.mlp(bags)).squeeze(-1)


def dataset(n: int, rows: int, seed: int) -> TensorDataset:
    """``n`` bags of item ids (a long-tailed draw: popular items recur) and their labels."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(rows, generator=g)
    popularity = torch.rand(n, BAG, generator=g) ** 3  # most draws fall on the first ids
    ids = (popularity * rows).long().clamp(max=rows - 1)
    labels = (scores[ids].sum(1) > 0).float()
    return TensorDataset(ids, labels)


def program(
    rows: int = 1_000_000,
    dim: int = DIM,
    batch_size: int = 256,
    samples: int = 16384,
    epochs: int = 10,
    lr: float = 0.01,
    seed: int = 0,
) -> TrainingProgram:
    """``rows * dim`` table parameters (16M by default) plus ~6k in the MLP."""
    return TrainingProgram(
        name="embedding",
        model=partial(BagClassifier, rows, dim),
        dataset=partial(dataset, samples, rows, 1000 + seed),
        loss=nn.functional.binary_cross_entropy_with_logits,
        optimizer="adam",
        lr=lr,
        batch_size=batch_size,
        epochs=epochs,
        seed=seed,
    )


def loop(**args: Any) -> nn.Module:
    """``program(**args)``'s training as a loop whose table the PS holds: its
    model with the table an ``elasticps.torch.Embedding``, its initial
    parameters, data order, global batch, loss and optimizer (Adam's fused
    kernel, as the program's)."""
    p = program(**args)
    torch.manual_seed(p.seed)
    model = p.model(ps_table=True)
    opt = torch.optim.Adam(model.parameters(), lr=p.lr, fused=True)
    model, opt = ept.prepare(model, opt)
    loader = ept.DataLoader(p.build_dataset(), batch_size=p.batch_size, shuffle=True, seed=p.seed)
    for _ in ept.epochs(p.epochs):
        for ids, labels in loader:
            opt.zero_grad()
            p.loss(model(ids), labels).backward()
            opt.step()
    return model

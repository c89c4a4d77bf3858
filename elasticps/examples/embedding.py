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

``elasticps train elasticps.examples.embedding:program --ps 2 --workers 2``
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn
from torch.utils.data import TensorDataset

from elasticps.program import TrainingProgram

BAG = 8


class BagClassifier(nn.Module):
    def __init__(self, rows: int, dim: int = 16, hidden: int = 64) -> None:
        super().__init__()
        self.table = nn.EmbeddingBag(rows, dim, mode="mean")
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())
        self.out = nn.Linear(hidden, 1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(self.mlp(self.table(ids))).squeeze(-1)


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
    dim: int = 16,
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

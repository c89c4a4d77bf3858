"""A recommendation-style loop as a user brings it: a user and an item
embedding table (a row is ``dim`` factors and a bias; a dot product plus the
biases gives click-through logits), Adagrad, a test pass after every epoch;
the six lines marked ``# elasticps`` are all that changed (docs/user-loop.md
shows the diff): the import, four calls, and the model built by
``ept.tables_on_ps`` (the PS holds its ``nn.Embedding`` tables; the class is
unchanged).

The data are generated clicks: users and items have hidden factors, items are
drawn by a power law (a few popular, a long tail), so a batch touches few rows
of the item table: the gradient is sparse in rows. The embedding tables are
the model: ``items=200_000, users=50_000, dim=32`` (the defaults) is 8.25M
parameters, 33 MB, and Adagrad's state as much again; the PS shards split
both, and a worker holds neither: its forward reads the rows of its batch from
the shards, and its step pushes their gradient (docs/user-loop.md).

Run alone: ``python -m elasticps.examples.recsys_loop``; as a job:
``elasticps train elasticps.examples.recsys_loop:main --ps 3 --workers 2``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import elasticps.torch as ept  # elasticps


def clicks(n: int, users: int, items: int, seed: int) -> TensorDataset:
    """``n`` generated (user, item, clicked) triples."""
    g = torch.Generator().manual_seed(seed)
    user_f = torch.randn(users, 4, generator=g)
    item_f = torch.randn(items, 4, generator=g)
    user = torch.randint(0, users, (n,), generator=g)
    item = (torch.rand(n, generator=g) ** 3 * items).long().clamp(max=items - 1)  # popular items first
    p = torch.sigmoid((user_f[user] * item_f[item]).sum(1))
    return TensorDataset(user, item, (torch.rand(n, generator=g) < p).float())


class Recommender(nn.Module):
    """A user's and an item's ``dim`` factors and a bias: one table row each."""

    def __init__(self, users: int, items: int, dim: int) -> None:
        super().__init__()
        self.dim = dim
        self.user = nn.Embedding(users, dim + 1)
        self.item = nn.Embedding(items, dim + 1)
        for table in (self.user, self.item):
            nn.init.normal_(table.weight[:, :dim], std=0.1)
            nn.init.zeros_(table.weight[:, dim])

    def forward(self, user: torch.Tensor, item: torch.Tensor) -> torch.Tensor:
        u, i = self.user(user), self.item(item)
        return (u[:, : self.dim] * i[:, : self.dim]).sum(1) + u[:, self.dim] + i[:, self.dim]


def test(model, data):
    user, item, clicked = data.tensors
    with torch.no_grad():
        logits = model(user, item)
    return F.binary_cross_entropy_with_logits(logits, clicked).item(), (
        (logits > 0) == (clicked > 0.5)
    ).float().mean().item()


def main(epochs=3, batch_size=512, samples=200_000, users=50_000, items=200_000, dim=32, lr=0.05, seed=0):
    torch.manual_seed(seed)
    train_set, test_set = clicks(samples, users, items, seed), clicks(samples // 10, users, items, seed + 1)
    loader = ept.DataLoader(train_set, batch_size=batch_size, shuffle=True)  # elasticps
    model = ept.tables_on_ps(Recommender, users, items, dim)  # elasticps: the PS holds its tables
    optimizer = torch.optim.Adagrad(model.parameters(), lr=lr)
    model, optimizer = ept.prepare(model, optimizer)  # elasticps
    for epoch in ept.epochs(epochs):  # elasticps
        for user, item, clicked in loader:
            loss = F.binary_cross_entropy_with_logits(model(user, item), clicked)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        test_loss, accuracy = test(model, test_set)
        print(f"epoch {epoch}: test loss {test_loss:.4f}, accuracy {accuracy:.3f}")
        ept.report(accuracy=accuracy, test_loss=test_loss)  # elasticps
    return model


if __name__ == "__main__":
    main()

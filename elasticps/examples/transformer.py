"""A small transformer encoder on generated sequences, with dict batches.

The task: sequences of 8-32 tokens over a vocabulary of 64, padded to 32;
the label is how many of the tokens 0-3 the sequence holds, capped at 3 (4
classes). Counting over positions needs attention or pooling, not one token.
A sample is ``({"tokens": LongTensor[32], "padding": BoolTensor[32]}, label)``:
the dict is batched by ``default_collate`` and passed to the model as keyword
arguments. Dropout is 0 and LayerNorm works per sample, so ``sync`` training
stays exact for any shape.

``elasticps train elasticps.examples.transformer:program --ps 2 --workers 2``
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn
from torch.utils.data import Dataset

from elasticps.program import TrainingProgram

VOCAB, LENGTH, CLASSES = 64, 32, 4


class Sequences(Dataset):
    """``n`` generated sequences (seeded), as dicts of tokens and a padding mask."""

    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.tokens = torch.randint(4, VOCAB, (n, LENGTH), generator=g)
        special = torch.rand(n, LENGTH, generator=g) < 0.06
        self.tokens[special] = torch.randint(0, 4, (int(special.sum()),), generator=g)
        lengths = torch.randint(8, LENGTH + 1, (n,), generator=g)
        self.padding = torch.arange(LENGTH)[None, :] >= lengths[:, None]
        self.tokens[self.padding] = 0
        counts = ((self.tokens < 4) & ~self.padding).sum(1)
        self.labels = counts.clamp(max=CLASSES - 1)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        return {"tokens": self.tokens[i], "padding": self.padding[i]}, self.labels[i]


class Classifier(nn.Module):
    def __init__(self, width: int = 64, layers: int = 2, heads: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width)
        self.position = nn.Parameter(torch.randn(LENGTH, width) * 0.02)
        layer = nn.TransformerEncoderLayer(width, heads, 2 * width, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, CLASSES)

    def forward(self, tokens: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        h = self.encoder(self.embed(tokens) + self.position, src_key_padding_mask=padding)
        keep = (~padding).unsqueeze(-1).float()
        return self.head((h * keep).sum(1) / keep.sum(1))  # the mean over real tokens


def accuracy(out: torch.Tensor, target: torch.Tensor) -> float:
    return float((out.argmax(dim=1) == target).float().mean())


def program(
    epochs: int = 10,
    batch_size: int = 64,
    samples: int = 4096,
    seed: int = 0,
    max_batch_size: int | None = None,
    optimizer: str = "adamw",
    width: int = 64,
    layers: int = 2,
    heads: int = 4,
) -> TrainingProgram:
    """``optimizer``: ``adamw`` (lr 1e-3, weight decay 0.01) or ``sgd`` (lr 0.05,
    momentum 0.9). The default model has 73k parameters; ``width=512, layers=6,
    heads=8`` is 12.7M, the size of a small BERT-like encoder."""
    adam = optimizer == "adamw"
    return TrainingProgram(
        name="transformer",
        model=partial(Classifier, width, layers, heads),
        dataset=lambda: Sequences(samples, seed=1000 + seed),
        eval_dataset=lambda: Sequences(1024, seed=2000 + seed),
        loss=nn.functional.cross_entropy,
        metric=accuracy,
        optimizer=optimizer,
        optimizer_kwargs={"weight_decay": 0.01} if adam else {"momentum": 0.9},
        lr=1e-3 if adam else 0.05,
        batch_size=batch_size,
        epochs=epochs,
        seed=seed,
        max_batch_size=max_batch_size,
    )

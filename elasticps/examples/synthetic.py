"""A synthetic ~10M-parameter model for benchmarks.

An MLP 512 -> 2048 -> 2048 -> 2048 -> 256 (10.0M float32 parameters, 40 MB),
about the size of a ResNet-18 (11.7M), trained on generated regression data.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

from elasticps.program import TrainingProgram

IN, HIDDEN, OUT = 512, 2048, 256


def model() -> nn.Module:
    return nn.Sequential(
        nn.Linear(IN, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, OUT),
    )


def dataset(num_samples: int = 4096, seed: int = 7) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(num_samples, IN, generator=g)
    w = torch.randn(IN, OUT, generator=g) / IN**0.5
    return TensorDataset(x, torch.tanh(x @ w))


def program(
    batch_size: int = 128, epochs: int = 1, optimizer: str = "adam", num_samples: int = 4096
) -> TrainingProgram:
    return TrainingProgram(
        name="synthetic-10m",
        model=model,
        dataset=lambda: dataset(num_samples),
        loss=nn.functional.mse_loss,
        optimizer=optimizer,
        lr=1e-4,
        batch_size=batch_size,
        epochs=epochs,
    )

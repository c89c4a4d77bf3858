"""Handwritten digits (scikit-learn's 8x8 set, shipped with the package): a real task.

``program()`` trains an MLP to >= 0.95 held-out accuracy in a few epochs.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

from elasticps.program import TrainingProgram

_SPLIT_SEED = 1234
_TEST_FRACTION = 0.25


def _split() -> tuple[TensorDataset, TensorDataset]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = x.astype("float32") / 16.0
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=_TEST_FRACTION, random_state=_SPLIT_SEED, stratify=y)

    def to_ds(a, b):
        return TensorDataset(torch.from_numpy(a), torch.from_numpy(b).long())

    return to_ds(x_tr, y_tr), to_ds(x_te, y_te)


def train_set() -> TensorDataset:
    return _split()[0]


def test_set() -> TensorDataset:
    return _split()[1]


def mlp(hidden: int = 128) -> nn.Module:
    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 10))


def cnn(channels: int = 32) -> nn.Module:
    """Two 3x3 convolutions, a pooling and two linear layers (~0.15M parameters
    at 32 channels): most of its time is compute, little is parameter traffic."""
    c = channels
    return nn.Sequential(
        nn.Unflatten(1, (1, 8, 8)),
        nn.Conv2d(1, c, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(c, 2 * c, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(2 * c * 16, 128),
        nn.ReLU(),
        nn.Linear(128, 10),
    )


def accuracy(out: torch.Tensor, target: torch.Tensor) -> float:
    return float((out.argmax(dim=1) == target).float().mean())


def program(
    epochs: int = 20,
    batch_size: int = 64,
    optimizer: str = "sgd",
    lr: float | None = None,
    seed: int = 0,
    model: str = "mlp",
    max_batch_size: int | None = None,
    lr_scaling: str = "sqrt",
) -> TrainingProgram:
    """``model``: ``mlp`` (small, fast) or ``cnn`` (compute-heavy, see :func:`cnn`);
    ``max_batch_size``: let the scheduler raise the global batch up to it."""
    if model not in ("mlp", "cnn"):
        raise ValueError(f"model must be 'mlp' or 'cnn', got {model!r}")
    kwargs = {"momentum": 0.9} if optimizer == "sgd" else {}
    return TrainingProgram(
        name=f"digits-{model}",
        model=mlp if model == "mlp" else cnn,
        dataset=train_set,
        eval_dataset=test_set,
        loss=nn.functional.cross_entropy,
        metric=accuracy,
        optimizer=optimizer,
        optimizer_kwargs=kwargs,
        lr=lr if lr is not None else (0.05 if optimizer == "sgd" else 1e-3),
        batch_size=batch_size,
        epochs=epochs,
        seed=seed,
        max_batch_size=max_batch_size,
        lr_scaling=lr_scaling,
    )


def cnn_program(
    epochs: int = 12,
    batch_size: int = 128,
    seed: int = 0,
    max_batch_size: int | None = None,
    lr: float | None = None,
) -> TrainingProgram:
    """The CNN on digits (SGD with momentum, lr 0.05 unless given): what ``elasticps demo`` trains."""
    return program(epochs=epochs, batch_size=batch_size, seed=seed, model="cnn", max_batch_size=max_batch_size, lr=lr)

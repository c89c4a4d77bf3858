"""A model's parameters and gradients as views into one flat float32 vector."""

from __future__ import annotations

import numpy as np
import torch


class FlatModel:
    """Rebinds a model's parameters (and gradients) to views of flat buffers.

    After construction, ``params`` and ``grads`` are 1-D float32 tensors; writing
    into ``params`` changes the model, and ``backward()`` accumulates into
    ``grads``. No copy is needed to send or receive a whole model.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        plist = [p for p in model.parameters() if p.requires_grad]
        for p in plist:
            if p.dtype != torch.float32:
                raise TypeError(f"elasticps trains float32 parameters, found {p.dtype}")
        self.numel = sum(p.numel() for p in plist)
        self.params = torch.zeros(self.numel, dtype=torch.float32)
        self.grads = torch.zeros(self.numel, dtype=torch.float32)
        offset = 0
        with torch.no_grad():
            for p in plist:
                n = p.numel()
                self.params[offset : offset + n].copy_(p.data.reshape(-1))
                p.data = self.params[offset : offset + n].view_as(p)
                p.grad = self.grads[offset : offset + n].view_as(p)
                offset += n

    def params_numpy(self) -> np.ndarray:
        return self.params.numpy()

    def grads_numpy(self) -> np.ndarray:
        return self.grads.numpy()


def shard_bounds(numel: int, num_shards: int) -> list[tuple[int, int]]:
    """Contiguous ``[lo, hi)`` ranges of nearly equal size covering ``numel``."""
    if num_shards < 1:
        raise ValueError("num_shards must be >= 1")
    base, extra = divmod(numel, num_shards)
    bounds = []
    lo = 0
    for i in range(num_shards):
        hi = lo + base + (1 if i < extra else 0)
        bounds.append((lo, hi))
        lo = hi
    return bounds


def flat_params(model: torch.nn.Module) -> np.ndarray:
    """A copy of a model's trainable parameters as one float32 vector."""
    return torch.cat([p.detach().reshape(-1) for p in model.parameters() if p.requires_grad]).numpy().copy()

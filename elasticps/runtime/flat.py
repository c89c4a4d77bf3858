"""A model's parameters and gradients as views into one flat float32 vector."""

from __future__ import annotations

import warnings

import numpy as np
import torch


class FlatModel:
    """Rebinds a model's parameters (and gradients) to views of flat buffers.

    After construction, ``params`` and ``grads`` are 1-D float32 tensors; writing
    into ``params`` changes the model, and ``backward()`` accumulates into
    ``grads``. No copy is needed to send or receive a whole model.
    """

    def __init__(
        self, model: torch.nn.Module, grads_buffer: np.ndarray | None = None, skip: set[int] | None = None
    ) -> None:
        """``skip``: ids of trainable parameters left out (tables the PS holds for the workers)."""
        self.model = model
        plist = [p for p in model.parameters() if p.requires_grad and id(p) not in (skip or ())]
        for p in plist:
            if p.dtype != torch.float32:
                raise TypeError(f"elasticps trains float32 parameters, found {p.dtype}")
        self.numel = sum(p.numel() for p in plist)
        self.params = torch.zeros(self.numel, dtype=torch.float32)
        if grads_buffer is not None and grads_buffer.shape != (self.numel,):
            raise ValueError(f"grads_buffer has shape {grads_buffer.shape}, the model needs ({self.numel},)")
        self.grads = torch.zeros(self.numel) if grads_buffer is None else torch.from_numpy(grads_buffer)
        self._layout: list[tuple[torch.nn.Parameter, int, int]] = []
        offset = 0
        with torch.no_grad():
            for p in plist:
                n = p.numel()
                self.params[offset : offset + n].copy_(p.data.reshape(-1))
                p.data = self.params[offset : offset + n].view_as(p)
                p.grad = self.grads[offset : offset + n].view_as(p)
                self._layout.append((p, offset, n))
                offset += n

    @property
    def layout(self) -> list[tuple[torch.nn.Parameter, int, int]]:
        """Each trainable parameter with its offset and size in the flat vector."""
        return self._layout

    def bind(self, parts: list[np.ndarray], bounds: list[tuple[int, int]]) -> None:
        """Use pulled shard arrays as the parameters without copying where possible.

        A parameter that lies inside one shard becomes a (read-only) view of that
        shard's array, which on the same node is the object store's memory; one
        that straddles two shards is copied into the local flat buffer.
        ``params`` is only complete for the copied parameters afterwards.
        """
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # read-only arrays: parameters are only read
            shard_tensors = [torch.from_numpy(part) for part in parts]
        j = 0
        for p, offset, n in self._layout:
            while bounds[j][1] <= offset:
                j += 1
            lo, hi = bounds[j]
            if offset + n <= hi:
                p.data = shard_tensors[j][offset - lo : offset - lo + n].view_as(p)
                continue
            dst = self.params[offset : offset + n]
            pos, k = offset, j
            while pos < offset + n:
                klo, khi = bounds[k]
                end = min(khi, offset + n)
                dst[pos - offset : end - offset].copy_(shard_tensors[k][pos - klo : end - klo])
                pos, k = end, k + 1
            p.data = dst.view_as(p)

    def unbind(self) -> None:
        """Every parameter a view of the model's own buffer again, letting go of
        the shard arrays :meth:`bind` viewed (their values are the next pull's business)."""
        for p, offset, n in self._layout:
            p.data = self.params[offset : offset + n].view_as(p)

    def load(self, parts: list[np.ndarray], bounds: list[tuple[int, int]]) -> None:
        """Copy pulled shard arrays into the model's own flat buffer (a user's loop
        may then read and write its parameters freely)."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # read-only arrays: only read here
            for part, (lo, hi) in zip(parts, bounds, strict=True):
                self.params[lo:hi].copy_(torch.from_numpy(part))
        for p, offset, n in self._layout:
            if p.data.data_ptr() != self.params.data_ptr() + 4 * offset:
                p.data = self.params[offset : offset + n].view_as(p)

    def collect_grads(self) -> None:
        """Gather every parameter's ``.grad`` into the flat gradient buffer (a
        parameter whose grad is None, after ``zero_grad()``, contributes zeros)."""
        with torch.no_grad():
            for p, offset, n in self._layout:
                view = self.grads[offset : offset + n]
                g = p.grad
                if g is None:
                    view.zero_()
                elif g.data_ptr() != view.data_ptr():
                    view.copy_(g.reshape(-1))

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


def param_layout(model: torch.nn.Module) -> list[tuple[str, list[int]]]:
    """Each trainable parameter's name and shape, in the flat vector's order."""
    return [(name, list(p.shape)) for name, p in model.named_parameters() if p.requires_grad]


def load_flat(model: torch.nn.Module, params: np.ndarray) -> torch.nn.Module:
    """Copy the flat vector ``params`` into ``model``'s trainable parameters, in
    order (the layout :class:`FlatModel` and the PS shards use); returns ``model``."""
    plist = [p for p in model.parameters() if p.requires_grad]
    numel = sum(p.numel() for p in plist)
    if params.shape != (numel,):
        raise ValueError(f"{params.shape[0]} parameters given, the model has {numel}")
    offset = 0
    with torch.no_grad():
        for p in plist:
            n = p.numel()
            p.copy_(torch.from_numpy(np.asarray(params[offset : offset + n])).view_as(p))
            offset += n
    return model

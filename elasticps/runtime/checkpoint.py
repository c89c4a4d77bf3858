"""Atomic checkpoints of a job: parameters, optimizer state, step, data position.

A checkpoint is one ``.npz`` file, written to a temporary name, flushed to disk
and renamed into place, so a reader sees either the previous checkpoint or the
new one, never a torn file; a write that fails (a full disk) removes its
temporary file. The data order and the workers' RNG are functions
of ``(seed, epoch)`` and ``(seed, step)``, so ``seed``, ``step`` and the data
position are the whole RNG state.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from elasticps.runtime.data import DataPosition
from elasticps.runtime.shard_state import ShardState

_NAME = re.compile(r"^ckpt-(\d{10})\.npz$")
log = logging.getLogger("elasticps.runtime")
#: A model's trainable parameters in their flat order: each one's name and shape.
Layout = list[tuple[str, list[int]]]
#: What reading a damaged checkpoint file raises.
_DAMAGED = (OSError, EOFError, ValueError, KeyError, TypeError, zipfile.BadZipFile)


@dataclass(frozen=True)
class Checkpoint:
    step: int
    position: DataPosition
    state: ShardState
    seed: int
    optimizer: str
    samples_seen: int
    batch_size: int | None = None  # the global batch when written (None: the program's)
    user_state: bytes | None = None  # a user loop's registered objects (elasticps.torch.register), serialised
    layout: Layout | None = None  # the model's parameters, names and shapes (None: written before they were kept)
    file: str | None = None  # the file's name, once read back


class CheckpointStore:
    """A directory of checkpoints, keeping the newest ``keep``."""

    def __init__(self, directory: str | os.PathLike[str], keep: int = 2) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.keep = max(1, keep)
        self.skipped: list[str] = []  # damaged checkpoints that latest() passed over

    def save(self, ckpt: Checkpoint) -> Path:
        meta = {
            "step": ckpt.step,
            "epoch": ckpt.position.epoch,
            "cursor": ckpt.position.cursor,
            "seed": ckpt.seed,
            "optimizer": ckpt.optimizer,
            "samples_seen": ckpt.samples_seen,
            "batch_size": ckpt.batch_size,
            "scalars": ckpt.state.scalars,
            "vectors": sorted(ckpt.state.vectors),
            "layout": ckpt.layout,
        }
        arrays = {"params": ckpt.state.params}
        arrays.update({f"opt__{k}": v for k, v in ckpt.state.vectors.items()})
        if ckpt.user_state is not None:
            arrays["user_state"] = np.frombuffer(ckpt.user_state, dtype=np.uint8)
        final = self.dir / f"ckpt-{ckpt.step:010d}.npz"
        tmp = self.dir / f".tmp-{os.getpid()}-{ckpt.step}.npz"
        try:
            with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
                np.savez(f, meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8), **arrays)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        dir_fd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        for old in self._all()[: -self.keep]:
            old.unlink(missing_ok=True)
        return final

    def _all(self) -> list[Path]:
        return sorted(p for p in self.dir.iterdir() if _NAME.match(p.name))

    def latest(self) -> Checkpoint | None:
        """The newest checkpoint that reads back whole. A damaged newer file is
        renamed ``*.corrupt`` (kept for a post-mortem, never pruned into the
        only good one's place) and named in :attr:`skipped`."""
        for path in reversed(self._all()):
            try:
                return self._read(path)
            except _DAMAGED as exc:
                aside = path.with_name(path.name + ".corrupt")
                os.replace(path, aside)
                self.skipped.append(f"{path.name} is damaged ({type(exc).__name__}: {exc}); set aside as {aside.name}")
                log.warning("checkpoint %s", self.skipped[-1])
        return None

    def intact(self) -> Iterator[tuple[Path, Checkpoint]]:
        """Every checkpoint that reads back whole, newest first, for a reader
        that must not write (``elasticps export``): damaged files are passed
        over, left where they are, and named in :attr:`skipped`."""
        for path in reversed(self._all()):
            try:
                ckpt = self._read(path)
            except _DAMAGED as exc:
                self.skipped.append(f"{path.name} is damaged ({type(exc).__name__}: {exc})")
                continue
            yield path, ckpt

    def _read(self, path: Path) -> Checkpoint:
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(bytes(data["meta"]).decode())
            state = ShardState(
                params=data["params"].copy(),
                vectors={k: data[f"opt__{k}"].copy() for k in meta["vectors"]},
                scalars=dict(meta["scalars"]),
            )
            user_state = bytes(data["user_state"]) if "user_state" in data.files else None
        layout = meta.get("layout")  # absent from checkpoints written before names were kept
        return Checkpoint(
            step=meta["step"],
            position=DataPosition(meta["epoch"], meta["cursor"]),
            state=state,
            seed=meta["seed"],
            optimizer=meta["optimizer"],
            samples_seen=meta["samples_seen"],
            batch_size=meta.get("batch_size"),
            user_state=user_state,
            layout=[(str(name), [int(n) for n in shape]) for name, shape in layout] if layout else None,
            file=path.name,
        )


def layout_mismatch(ckpt: Checkpoint, model: Layout) -> str | None:
    """Why ``ckpt`` cannot hold the parameters of a model laid out as ``model``
    (one clause naming the first parameter that differs), or None if it can. A
    checkpoint written before layouts were kept is checked by its size alone."""
    if ckpt.layout is None:
        numel = sum(math.prod(shape) for _, shape in model)
        have = ckpt.state.numel
        return None if have == numel else f"it holds {have} parameters, the model has {numel}"
    theirs, ours = dict(ckpt.layout), dict(model)
    for name, shape in ckpt.layout:
        if name in ours and list(shape) != list(ours[name]):
            return f"{name} is {list(shape)} in the checkpoint, {list(ours[name])} in the model"
    for name, shape in model:
        if name not in theirs:
            return f"{name} {list(shape)} is in the model, not in the checkpoint"
    for name, shape in ckpt.layout:
        if name not in ours:
            return f"{name} {list(shape)} is in the checkpoint, not in the model"
    if [name for name, _ in ckpt.layout] != [name for name, _ in model]:
        return "the model defines the same parameters in another order"
    return None

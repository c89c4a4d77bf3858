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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from elasticps.errors import ConfigError, ProgramError, UserCodeError
from elasticps.private_dir import private_dir
from elasticps.runtime.config import JobConfig
from elasticps.runtime.data import DataPosition
from elasticps.runtime.shard_state import ShardState

_NAME = re.compile(r"^ckpt-(\d{10})\.npz$")
log = logging.getLogger("elasticps.runtime")
#: A model's trainable parameters in their flat order: each one's name and shape.
Layout = list[tuple[str, list[int]]]
#: What reading a damaged checkpoint file raises.
_DAMAGED = (OSError, EOFError, ValueError, KeyError, TypeError, zipfile.BadZipFile)


def checkpoint_files(directory: Path) -> list[Path]:
    """The checkpoint files in ``directory``, oldest first (none if it is not there);
    a half-written or damaged one set aside has another name."""
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if _NAME.match(p.name))


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
        private_dir(self.dir)
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
        return checkpoint_files(self.dir)

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


class Checkpoints:
    """The job's checkpoints: the newest intact one, and when the last was written."""

    def __init__(self, config: JobConfig, event: Callable[[str], None]) -> None:
        self.config = config
        self.store = CheckpointStore(config.checkpoint_dir) if config.checkpoint_dir else None
        self._event = event
        self.last_step = -1  # the step of the last checkpoint this run wrote

    def latest(self) -> Checkpoint | None:
        """The newest intact checkpoint; damaged newer ones become events."""
        if not self.store:
            return None
        seen = len(self.store.skipped)
        ckpt = self.store.latest()
        for message in self.store.skipped[seen:]:
            self._event(f"checkpoint {message}")
        return ckpt

    def save(self, ckpt: Checkpoint) -> None:
        assert self.store is not None
        self.store.save(ckpt)
        self.last_step = ckpt.step

    def due(self, step: int) -> bool:
        """Whether ``checkpoint_every_steps`` steps ran since the last checkpoint."""
        every = self.config.checkpoint_every_steps
        return bool(self.store and every and step - self.last_step >= every)

    def check(self, ckpt: Checkpoint, program: Any, layout: Layout) -> None:
        """Raise if ``ckpt`` was not written by this program (seed, optimizer, model)."""
        if ckpt.seed != program.seed or ckpt.optimizer != program.optimizer_name:
            raise ConfigError(
                f"checkpoint in {self.config.checkpoint_dir} is for seed {ckpt.seed} / {ckpt.optimizer}, "
                f"the program has seed {program.seed} / {program.optimizer_name}"
            )
        why = layout_mismatch(ckpt, layout)
        if why:  # the program's code changed since the checkpoint was written
            raise UserCodeError(f"checkpoint {ckpt.file} does not match the model: {why}")

    def batch_of(self, ckpt: Checkpoint, program: Any) -> int:
        """The global batch ``ckpt`` was taken at, if ``program`` still allows it."""
        assert ckpt.batch_size is not None
        try:
            return program.check_batch(ckpt.batch_size)
        except ProgramError as exc:
            raise ProgramError(
                f"the checkpoint at step {ckpt.step} was taken at global batch {ckpt.batch_size}, which the "
                f"program no longer allows (its batch {program.batch_size}, max_batch_size "
                f"{program.max_batch_size}): {exc}"
            ) from exc

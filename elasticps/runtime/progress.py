"""Where a job stands in its training: step, data position, samples, global batch, epochs.

The data position alone says which samples come next, whatever the job's
shape (:mod:`elasticps.runtime.data`); this module moves it as steps stand,
puts it back to a checkpoint's after a restore, and times each epoch. Other
threads read it (under the controller's lock) for a report. No Ray here: the
metric of an epoch is computed by the caller and passed in.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from elasticps.runtime.checkpoint import Checkpoint
from elasticps.runtime.data import DataPosition, GlobalBatches
from elasticps.runtime.reports import EpochReport


class Progress:
    """``step``: steps done; ``position``: the data position of the next
    step; ``samples_seen``: samples trained on; ``batch_size``: the global
    batch M now; ``epochs``: a report per epoch done. Writes other threads may
    read hold ``lock``."""

    def __init__(self, program: Any, lock: threading.RLock) -> None:
        self.program = program
        self._lock = lock
        self.step = 0
        self.position = DataPosition(0, 0)
        self.samples_seen = 0
        self.batch_size: int = program.batch_size
        self.batches: GlobalBatches | None = None  # the data order, once the dataset's size is known
        self.epochs: list[EpochReport] = []
        self._epoch_start = (0.0, 0)  # when the epoch began (monotonic s), and samples_seen then
        self._epoch_starts: list[tuple[float, int]] = []  # the same for each epoch of ``epochs``

    @property
    def done(self) -> bool:
        return self.position.epoch >= self.program.epochs

    def samples_per_epoch(self) -> int | None:
        """Training samples in one epoch (None until the dataset was read)."""
        return None if self.batches is None else self.batches.num_samples

    def remaining_samples(self) -> int | None:
        """Samples left to train (None until the dataset was read)."""
        if self.batches is None:
            return None
        n = self.batches.num_samples
        return max(0, (self.program.epochs - self.position.epoch) * n - self.position.cursor)

    def lr(self) -> float:
        """The learning rate of the next step (the program's rule for the global batch)."""
        return self.program.lr_at(self.step, self.batch_size)

    def resume(self, ckpt: Checkpoint) -> None:
        """Go back to ``ckpt``'s step, data position and samples; the reports of
        epochs that ended after it are undone (they end again, timed from the
        start of the first of them)."""
        with self._lock:
            self.step, self.position, self.samples_seen = ckpt.step, ckpt.position, ckpt.samples_seen
            kept = sum(1 for e in self.epochs if e.step <= ckpt.step)
            if kept < len(self.epochs):
                self._epoch_start = self._epoch_starts[kept]
            del self.epochs[kept:], self._epoch_starts[kept:]

    # ---------------------------------------------------------- sync steps
    def next_batch(self) -> tuple[np.ndarray, DataPosition, np.ndarray | None]:
        """The global batch of the next sync step, the position after it, and
        the batch after that if the job goes on (read ahead while the step runs)."""
        assert self.batches is not None
        idx, next_pos = self.batches.take(self.position, self.batch_size)
        upcoming = None
        if next_pos.epoch < self.program.epochs:
            upcoming = self.batches.take(next_pos, self.batch_size)[0]
        return idx, next_pos, upcoming

    def advance(self, samples: int, next_pos: DataPosition) -> int | None:
        """A sync step of ``samples`` stood: move to ``next_pos``. Returns the
        epoch that it ended, if any."""
        epoch = self.position.epoch
        with self._lock:
            self.samples_seen += samples
            self.position = next_pos
        return epoch if next_pos.epoch > epoch else None

    # --------------------------------------------------------- async steps
    def hand_out(self, samples: int) -> np.ndarray:
        """The next ``samples`` indices for one async step; the position moves past them."""
        assert self.batches is not None
        idx, nxt = self.batches.take(self.position, samples)
        with self._lock:
            self.position = nxt
        return idx

    def count(self, samples: int) -> None:
        """An async step of ``samples`` stood."""
        self.step += 1
        with self._lock:
            self.samples_seen += samples

    # -------------------------------------------------------------- epochs
    def start_epoch_clock(self, now: float) -> None:
        self._epoch_start = (now, self.samples_seen)

    def end_epoch(
        self,
        epoch: int,
        now: float,
        loss: float | None,
        noise_scale: float | None,
        metric: float | None,
        metrics: dict[str, float | None],
        shape: tuple[int, int],
    ) -> EpochReport:
        """The report of ``epoch``, which ended ``now`` with the job at ``shape`` (#PS, #workers)."""
        t0, s0 = self._epoch_start
        elapsed = max(1e-9, now - t0)
        report = EpochReport(
            epoch=epoch,
            step=self.step,
            samples_per_s=(self.samples_seen - s0) / elapsed,
            elapsed_s=elapsed,
            loss=loss,
            metric=metric,
            noise_scale=noise_scale,
            num_ps=shape[0],
            num_workers=shape[1],
            batch_size=self.batch_size,
            metrics=metrics,
        )
        with self._lock:
            self.epochs.append(report)
            self._epoch_starts.append((t0, s0))
        return report

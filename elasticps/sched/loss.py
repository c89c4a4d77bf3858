"""A job's loss over epochs (:class:`LossCurve`), fitted to say how many
epochs it needs to reach a target loss."""

from __future__ import annotations

import math

import numpy as np


class LossCurve:
    """``l(k) = 1 / (b0*k + b1) + b2`` over epochs k, for jobs with a loss target.

    For a fixed b2 the curve is linear in (b0, b1) after ``1/(l - b2)``; b2 is
    found by a grid search below the smallest observed loss.
    """

    def __init__(self) -> None:
        self.b: tuple[float, float, float] | None = None

    def fit(self, epochs: list[float], losses: list[float]) -> LossCurve:
        k = np.asarray(epochs, dtype=float)
        loss = np.asarray(losses, dtype=float)
        if len(k) < 3:
            self.b = None
            return self
        best = None
        lo = float(loss.min())
        for b2 in np.linspace(0.0, lo * 0.999, 200):
            z = 1.0 / (loss - b2)
            a = np.vstack([k, np.ones_like(k)]).T
            (b0, b1), *_ = np.linalg.lstsq(a, z, rcond=None)
            if b0 <= 0 or b1 <= 0:
                continue
            err = float(np.sum((1.0 / (b0 * k + b1) + b2 - loss) ** 2))
            if best is None or err < best[0]:
                best = (err, (float(b0), float(b1), float(b2)))
        self.b = None if best is None else best[1]
        return self

    def predict(self, epoch: float) -> float:
        if self.b is None:
            return math.nan
        b0, b1, b2 = self.b
        return 1.0 / (b0 * epoch + b1) + b2

    def epochs_to(self, target_loss: float) -> float:
        """Epochs (from 0) until the loss reaches ``target_loss``; inf if never."""
        if self.b is None:
            return math.inf
        b0, b1, b2 = self.b
        if target_loss <= b2:
            return math.inf
        return max(0.0, (1.0 / (target_loss - b2) - b1) / b0)

"""A job's speed as a function of (#PS p, #workers w), learned from its epochs.

The Optimus model (Peng et al., EuroSys'18), M the global batch:

    sync :  1/f = t0*M/w + t1 + t2*w/p + t3*w + t4*p     (f: steps/s; samples/s = M*f)
              compute split over w | fixed | PS bandwidth per shard | worker overheads | PS overheads
    async:  f = w / (t0 + t1*w/p + t2*w + t3*p)            (f: worker steps/s; samples/s = f*M/w)

Both are linear in the non-negative t's once rewritten (sync: y = M/speed;
async: y = M/speed, same features without the M/w term), so they are fitted
by non-negative least squares. With fewer distinct shapes than coefficients
the fit is pulled towards a conservative prior (70% of the observed step is
compute, 30% PS traffic) by ridge rows; the prior fades as shapes accumulate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls

PRIOR_WEIGHT = 1.0  # weight of each prior row relative to one observation
COMPUTE_SHARE = 0.7


@dataclass(frozen=True)
class Observation:
    num_ps: int
    num_workers: int
    samples_per_s: float


class SpeedModel:
    """``fit(observations)`` then ``predict(p, w)`` (samples/s); callable as ``model(p, w)``."""

    def __init__(self, batch_size: int, mode: str = "sync") -> None:
        if mode not in ("sync", "async"):
            raise ValueError(f"mode must be sync or async, got {mode!r}")
        self.batch = float(batch_size)
        self.mode = mode
        self.theta: np.ndarray | None = None
        self.shapes: set[tuple[int, int]] = set()

    # sync: [M/w, 1, w/p, w, p]; async: [1, w/p, w, p] (times w/M folded into y)
    def _features(self, p: int, w: int) -> list[float]:
        w_over_p = w / p if p > 0 else 0.0
        if self.mode == "sync":
            return [self.batch / w, 1.0, w_over_p, float(w), float(p)]
        return [1.0, w_over_p, float(w), float(p)]

    def _target(self, o: Observation) -> float:
        # sync: step time M/speed; async: w/f with f = speed*w/M  ->  M/speed as well
        return self.batch / o.samples_per_s

    def fit(self, observations: list[Observation]) -> SpeedModel:
        obs = [o for o in observations if o.samples_per_s > 0 and o.num_workers > 0]
        if not obs:
            self.theta, self.shapes = None, set()
            return self
        self.shapes = {(o.num_ps, o.num_workers) for o in obs}
        rows = [self._features(o.num_ps, o.num_workers) for o in obs]
        ys = [self._target(o) for o in obs]
        n_coef = len(rows[0])
        deficit = n_coef - len(self.shapes)
        if deficit > 0:  # too few shapes to tell the terms apart: lean on the prior
            prior = self._prior(obs[-1])
            scale = np.mean(ys)
            for i in range(n_coef):
                row = [0.0] * n_coef
                row[i] = PRIOR_WEIGHT * deficit * scale / max(prior[i], 1e-12) if prior[i] > 0 else PRIOR_WEIGHT
                rows.append(row)
                ys.append(row[i] * prior[i])
        theta, _ = nnls(np.asarray(rows), np.asarray(ys))
        self.theta = theta
        return self

    def _prior(self, o: Observation) -> list[float]:
        step = self._target(o)
        p, w = max(o.num_ps, 1), o.num_workers
        if self.mode == "sync":
            return [COMPUTE_SHARE * step * w / self.batch, 0.0, (1 - COMPUTE_SHARE) * step * p / w, 0.0, 0.0]
        return [COMPUTE_SHARE * step, (1 - COMPUTE_SHARE) * step * p / w, 0.0, 0.0]

    def predict(self, p: int, w: int) -> float:
        """Predicted samples/s (0 without observations or for w < 1)."""
        if self.theta is None or w < 1:
            return 0.0
        y = float(np.dot(self.theta, self._features(p, w)))
        if y <= 0:
            return 0.0
        return self.batch / y  # both forms: y = M / samples_per_s

    __call__ = predict

    @property
    def confident(self) -> bool:
        return len(self.shapes) >= 3

    def explore(self, current: tuple[int, int], max_ps: int, max_workers: int) -> tuple[int, int] | None:
        """A shape not yet observed that tells the most: first more workers (the
        compute term), then another PS (the traffic term), then both."""
        p, w = current
        for cand in (
            (p, min(max_workers, 2 * w)),
            (min(max_ps, p + 1), w),
            (min(max_ps, p + 1), min(max_workers, 2 * w)),
        ):
            if cand not in self.shapes and cand != current:
                return cand
        return None


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

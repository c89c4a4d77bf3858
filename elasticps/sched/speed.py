"""A job's speed as a function of (#PS p, #workers w), learned from its epochs.

The Optimus model (Peng et al., EuroSys'18), M the global batch, extended
with where the PS traffic goes (c: the fraction of it that crosses nodes, as
measured from where the tasks were placed, else 1 - 1/n for tasks spread
evenly over n nodes, which is also what predictions assume):

    sync :  1/f = t0*M/w + t1 + (w/p)*(tl*(1-c) + tx*c) + t3*w + t4*p     (f: steps/s; samples/s = M*f)
              compute over w | fixed | PS traffic, same node / across nodes | worker and PS overheads
    async:  f = w / (t0 + (w/p)*(tl*(1-c) + tx*c) + t2*w + t3*p)         (f: worker steps/s; samples/s = f*M/w)

Both are linear in the non-negative t's once rewritten (y = M/speed), so they
are fitted by non-negative least squares, with one row per distinct shape
(the mean of its observations, weighted by how many there are, up to
:data:`WEIGHT_CAP` for one job's model, all of them for a fleet prior) and a
weak prior row per coefficient: 70% of the latest
observed step is compute and 30% PS traffic, traffic across nodes
:data:`CROSS_COST` times dearer than on one node, each coefficient free to be
off by as much as the whole step. Directions the data do not pin down stay at
the prior, with that prior's wide uncertainty.

A fleet prior (:func:`fleet_prior`) is this model fitted on many jobs' reports
of one kind; its pooled curve is :mod:`elasticps.sched.pooling`.

The fit's uncertainty (the covariance of the coefficients, with the
observations' noise estimated from the residuals, never below
:data:`NOISE_FLOOR`) decides exploration: :meth:`SpeedModel.probes` ranks the
shapes not yet seen by an optimistic speed, predicted x (1 + OPTIMISM x
relative std), and keeps those that could beat the best speed seen by more
than ``min_gain``. A model with nothing left worth probing is confident; a
model whose predictions miss by more than the noise has larger residuals,
hence a wider uncertainty, and probes again.
"""

from __future__ import annotations

import copy
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls

from elasticps.sched.pooling import PRIOR_TOTAL, PooledCurve

COMPUTE_SHARE = 0.7
CROSS_COST = 4.0  # prior: a byte between nodes costs this many times one within a node
NOISE_FLOOR = 0.03  # relative std of one observation, at least
OPTIMISM = 1.5  # probes are ranked by predicted speed x (1 + OPTIMISM x relative std)
MAX_RELATIVE_STD = 1.0  # extrapolation far from the data counts no more optimistic than this
WEIGHT_CAP = 10  # repeated observations of one shape weigh as at most this many
MIN_GAIN = 0.02  # a probe must be able to beat the best speed seen by this much
CONFIRM = 2  # a best mean seen of fewer runs than this is probed again before it is trusted

#: How many nodes a shape's tasks span once placed, for predictions.
SpanFn = Callable[[int, int], int]
#: One row of a fit: (p, w, nodes, global batch, share of PS traffic across nodes).
_Key = tuple[int, int, int, int, float]


def _cross(nodes: int, measured: float | None) -> float:
    """The share of PS traffic across nodes: as measured, else as if the tasks
    were spread evenly over ``nodes``."""
    return 1.0 - 1.0 / max(1, nodes) if measured is None else min(1.0, max(0.0, measured))


@dataclass(frozen=True)
class Observation:
    num_ps: int
    num_workers: int
    samples_per_s: float
    nodes: int = 1  # the nodes the job's tasks were on
    batch: int = 0  # the global batch it ran at (0: the model's)
    #: the share of the PS traffic that crossed nodes as the tasks were placed
    #: (None: 1 - 1/nodes, as if spread evenly). Placement keeps most of a
    #: job on one node, so that guess can be far off: 1 PS and 8 workers over
    #: 2 nodes send 1/8 of the traffic across, not 1/2.
    cross: float | None = None


class SpeedModel(PooledCurve):
    """``fit(observations)`` then ``predict(p, w)`` (samples/s); callable as ``model(p, w)``.

    ``span(p, w)``: the nodes a shape would span once placed (by default 1: the
    speed then does not depend on placement). ``compute_share``: the share of a
    step the job was measured to spend computing (the runtime's step-time
    breakdown), for the prior; :data:`COMPUTE_SHARE` when not measured (the
    live manager passes the latest window's; the simulator models no breakdown).
    """

    def __init__(
        self,
        batch_size: int,
        mode: str = "sync",
        span: SpanFn | None = None,
        compute_share: float | None = None,
        weight_cap: int | None = WEIGHT_CAP,
    ) -> None:
        if mode not in ("sync", "async"):
            raise ValueError(f"mode must be sync or async, got {mode!r}")
        self.compute_share = COMPUTE_SHARE if compute_share is None else min(0.95, max(0.05, compute_share))
        self.batch = float(batch_size)
        self.mode = mode
        self.span = span
        self.weight_cap = weight_cap  # None: every observation of a shape counts (a fleet prior)
        self.theta: np.ndarray | None = None
        self.cov: np.ndarray | None = None
        self.shapes: set[tuple[int, int]] = set()
        self.best_seen = 0.0  # the highest mean speed of one (shape, nodes) observed
        self.noise = NOISE_FLOOR
        #: relative std of one observation about its own shape's mean (None: no shape observed twice)
        self.replicate_noise: float | None = None
        self._seen: dict[tuple[int, int, int], float] = {}  # mean samples/s of each (p, w, nodes) observed
        self._seen_n: dict[tuple[int, int, int], int] = {}  # how many observations each mean is of
        self._runs: dict[tuple[int, int], int] = {}  # observations of each shape, on any nodes, at any batch
        self._probes: dict[tuple[int, int, int, int], list[tuple[int, int]]] = {}
        self._best_pooled: float | None = None
        self._pooled: dict[tuple[int, int], tuple[float, float]] = {}  # (speed, relative std) of pooled()

    def with_span(self, span: SpanFn | None) -> SpeedModel:
        """The same fit, predicting for tasks that span ``span(p, w)`` nodes (a
        fleet prior judged for one job, whose tasks may be sized differently)."""
        other = copy.copy(self)
        other.span, other._probes, other._best_pooled, other._pooled = span, {}, None, {}
        return other

    def _nodes(self, p: int, w: int) -> int:
        return max(1, self.span(p, w)) if self.span is not None else 1

    # sync: [M/w, 1, w/p same node, w/p across, w, p]; async: the same without M/w.
    # No PS (p = 0): the workers all-reduce in a ring, 2(w-1)/w of the gradient
    # each, at the speed of its slowest link: within a node, or across nodes.
    # A sync step's compute scales with the global batch (``batch``, the model's by default).
    # ``cross``: the share of PS traffic across nodes (1 - 1/nodes unless measured).
    def _features(
        self, p: int, w: int, nodes: int, batch: float | None = None, cross: float | None = None
    ) -> list[float]:
        m = self.batch if not batch else float(batch)
        if p == 0:
            ring = 2.0 * (w - 1) / w
            tail = [ring if nodes <= 1 else 0.0, ring if nodes > 1 else 0.0, float(w), 0.0]
            return [m / w, 1.0, *tail] if self.mode == "sync" else [1.0, *tail]
        cross = _cross(nodes, cross)
        w_over_p = w / p
        tail = [w_over_p * (1.0 - cross), w_over_p * cross, float(w), float(p)]
        return [m / w, 1.0, *tail] if self.mode == "sync" else [1.0, *tail]

    def _scale_features(self, p: int, w: int) -> list[float]:
        """Features with both traffic columns in use: how large each term can be."""
        if p == 0:
            return [max(a, b) for a, b in zip(self._features(p, w, 1), self._features(p, w, 2), strict=True)]
        return self._features(p, w, 2)

    def _prior(self, o: Observation) -> np.ndarray:
        """Coefficients that explain ``o``'s step as compute (``compute_share`` of
        it, 70% unless measured) and PS traffic (the rest)."""
        batch = float(o.batch or self.batch)
        step = batch / o.samples_per_s
        p, w = max(o.num_ps, 1), o.num_workers
        cross = _cross(o.nodes, o.cross)
        if o.num_ps == 0:  # the ring: its share of the step, at its link
            ring = max(2.0 * (w - 1) / w, 1.0)
            local = (1 - self.compute_share) * step / ring / (CROSS_COST if o.nodes > 1 else 1.0)
        else:
            local = (1 - self.compute_share) * step * p / w / ((1.0 - cross) + CROSS_COST * cross)
        share = self.compute_share
        compute = [share * step * w / batch, 0.0] if self.mode == "sync" else [share * step]
        return np.asarray([*compute, local, CROSS_COST * local, 0.0, 0.0])

    def fit(self, observations: list[Observation]) -> SpeedModel:
        obs = [o for o in observations if o.samples_per_s > 0 and o.num_workers > 0]
        self._probes, self._best_pooled, self._pooled = {}, None, {}
        if not obs:
            self.theta, self.cov, self.shapes, self.best_seen, self._seen = None, None, set(), 0.0, {}
            self._seen_n, self._runs, self.replicate_noise = {}, {}, None
            return self
        rows = [self._key(o) for o in obs]
        steps = [key[3] / o.samples_per_s for key, o in zip(rows, obs, strict=True)]
        groups: dict[_Key, list[float]] = {}  # step times of each (p, w, nodes, batch, cross)
        at_batch: dict[tuple[int, int, int], list[float]] = {}  # step times at the model's batch, per (p, w, nodes)
        batch = int(self.batch)
        for key, step in zip(rows, steps, strict=True):
            groups.setdefault(key, []).append(step)
            if key[3] == batch:
                at_batch.setdefault(key[:3], []).append(step)
        keys = sorted(groups)
        index = {k: i for i, k in enumerate(keys)}
        row_of = np.asarray([index[key] for key in rows])  # each observation's row
        step_of = np.asarray(steps)
        x = np.asarray([self._features(*k) for k in keys])
        y = np.asarray([float(np.mean(groups[k])) for k in keys])
        cap = self.weight_cap or max(len(g) for g in groups.values())
        n = np.asarray([min(len(groups[k]), cap) for k in keys], dtype=float)
        self.shapes = {k[:2] for k in keys}
        self._runs = dict(Counter(key[:2] for key in rows))
        self._seen, self._seen_n = {}, {}
        for where, times in at_batch.items():
            latest = times[-cap:]
            self._seen[where] = float(np.mean([self.batch / v for v in latest]))
            self._seen_n[where] = len(latest)
        # the prior: its mean from the latest observation, its width the whole step
        prior = self._prior(obs[-1])
        scale = np.mean(np.abs(np.asarray([self._scale_features(*k[:2]) for k in keys])), axis=0)
        ref = float(np.mean(y))
        prior_precision = np.where(scale > 0, scale / ref, 1.0 / ref) ** 2
        noise = NOISE_FLOOR
        for _ in range(2):  # once with the floor, once with the noise the residuals show
            weight = np.sqrt(n) / (noise * y)
            a = np.vstack([x * weight[:, None], np.diag(np.sqrt(prior_precision))])
            b = np.concatenate([y * weight, np.sqrt(prior_precision) * prior])
            theta, _ = nnls(a, b)
            fitted = np.asarray([float(np.dot(theta, row)) for row in x])[row_of]
            ok = fitted > 0
            resid = (step_of[ok] - fitted[ok]) / fitted[ok]  # each observation's relative miss of its fitted step
            noise = max(NOISE_FLOOR, math.sqrt(float(np.mean(np.square(resid)))) if resid.size else NOISE_FLOOR)
        self.theta, self.noise = theta, noise
        self.replicate_noise = _replicate_noise(groups)
        self.cov = np.linalg.pinv(a.T @ a)
        # the best speed seen, at the model's batch: measured there, else the form's
        self.best_seen = max(
            self._seen.get((p, w, nodes)) or self._form(p, w, nodes, self.batch) for p, w, nodes, _, _ in keys
        )
        return self

    def _key(self, o: Observation) -> _Key:
        """(p, w, nodes, batch, cross) of an observation: one row of the fit."""
        nodes = max(1, o.nodes)
        cross = _cross(nodes, o.cross) if o.num_ps > 0 else 0.0
        return o.num_ps, o.num_workers, nodes, o.batch or int(self.batch), cross

    def _form(self, p: int, w: int, nodes: int, batch: float) -> float:
        assert self.theta is not None
        y = float(np.dot(self.theta, self._features(p, w, nodes, batch)))
        return batch / y if y > 0 else 0.0

    def batch_ratio(self, p: int, w: int, batch: int) -> float:
        """samples/s at global batch ``batch`` over samples/s at the model's batch,
        by the fitted form (1.0 when unknown, or in async mode)."""
        if self.theta is None or self.mode != "sync" or w < 1 or batch == int(self.batch):
            return 1.0
        nodes = self._nodes(p, w)
        here = self._form(p, w, nodes, self.batch)
        return self._form(p, w, nodes, float(batch)) / here if here > 0 else 1.0

    def predict_at(self, p: int, w: int, batch: int) -> float:
        """Predicted samples/s at global batch ``batch`` (sync mode: the compute
        term scales with it, the rest of the step does not)."""
        if batch == int(self.batch) or self.mode != "sync":
            return self.predict(p, w)
        if self.theta is None or w < 1:
            return 0.0
        return self._form(p, w, self._nodes(p, w), float(batch))

    def predict(self, p: int, w: int) -> float:
        """Predicted samples/s (0 without observations or for w < 1): the mean
        of the latest observations where the shape was seen on as many nodes,
        else the fitted form."""
        if self.theta is None or w < 1:
            return 0.0
        seen = self.observed(p, w)
        return seen if seen is not None else self.form(p, w)

    __call__ = predict

    def form(self, p: int, w: int) -> float:
        """The fitted form's samples/s at (p, w) on the nodes it would span,
        whatever was observed there (0 without observations or for w < 1):
        what a fleet prior predicts, its form fitted on many jobs' reports
        being surer than the mean of those at any one shape."""
        if self.theta is None or w < 1:
            return 0.0
        return self._form(p, w, self._nodes(p, w), self.batch)  # both forms: y = M / samples_per_s

    def relative_std(self, p: int, w: int) -> float:
        """The fit's uncertainty of the speed at (p, w), relative to the prediction."""
        if self.theta is None or self.cov is None or w < 1:
            return math.inf
        x = np.asarray(self._features(p, w, self._nodes(p, w)))
        y = float(np.dot(self.theta, x))
        return math.sqrt(max(0.0, float(x @ self.cov @ x))) / y if y > 0 else math.inf

    def probes(
        self, min_ps: int, max_ps: int, min_workers: int, max_workers: int, count: int = 3
    ) -> list[tuple[int, int]]:
        """Up to ``count`` shapes not yet seen, best first by optimistic speed,
        that could beat the best speed seen by more than :data:`MIN_GAIN`;
        empty when nothing within the limits is worth probing (confident)."""
        key = (min_ps, max_ps, min_workers, max_workers)
        if key in self._probes:
            return self._probes[key][:count]
        if self.theta is None or self.cov is None:
            return []
        cands = [
            (p, w)
            for p in range(min_ps, max_ps + 1)
            for w in range(max(1, min_workers), max_workers + 1)
            if (p, w) not in self.shapes
        ]
        if not cands:
            self._probes[key] = []
            return []
        x = np.asarray([self._features(p, w, self._nodes(p, w)) for p, w in cands])
        y = x @ self.theta
        sd = np.sqrt(np.maximum(0.0, np.einsum("ij,jk,ik->i", x, self.cov, x)))
        ok = y > 0
        speed = np.where(ok, self.batch / np.where(ok, y, 1.0), 0.0)
        rel = np.minimum(np.where(ok, sd / np.where(ok, y, 1.0), MAX_RELATIVE_STD), MAX_RELATIVE_STD)
        optimistic = speed * (1.0 + OPTIMISM * rel)
        order = sorted(range(len(cands)), key=lambda i: (-optimistic[i], cands[i]))
        bar = self.best_seen * (1.0 + MIN_GAIN)
        self._probes[key] = [cands[i] for i in order if optimistic[i] > bar]
        return self._probes[key][:count]

    def unconfirmed_best(self, min_ps: int, max_ps: int, min_workers: int, max_workers: int) -> tuple[int, int] | None:
        """The shape within the limits whose mean is the best speed seen, if it
        was run fewer than :data:`CONFIRM` times: one report, as noisy as a
        report is (docs/scheduler.md). Runs count on any nodes and at any
        batch: one more look settles the doubt, wherever it lands, so that it
        never lasts (an adaptive job may never run the model's batch again)."""
        seen = [
            (v, (p, w))
            for p, w, v, _ in self.seen_at_span()
            if min_ps <= p <= max_ps and min_workers <= w <= max_workers
        ]
        if not seen:
            return None
        v, (p, w) = max(seen)
        if v < self.best_seen:  # the best speed seen is elsewhere (outside the limits, on other nodes, or the
            return None  # form's at a shape run only at another batch): this mean decides nothing
        return (p, w) if self._runs.get((p, w), 0) < CONFIRM else None

    def observed(self, p: int, w: int) -> float | None:
        """The mean of the latest observations of (p, w) on the nodes it would span, if any."""
        return self._seen.get((p, w, self._nodes(p, w)))

    def seen_at_span(self) -> list[tuple[int, int, float, int]]:
        """(p, w, mean samples/s, count) of every shape observed on the nodes it would span."""
        return [(p, w, v, self._seen_n[(p, w, n)]) for (p, w, n), v in self._seen.items() if n == self._nodes(p, w)]

    def observed_count(self, p: int, w: int) -> int:
        """How many observations :meth:`observed`'s mean is of (up to the weight cap)."""
        return self._seen_n.get((p, w, self._nodes(p, w)), 0)

    def estimate_sd(self, p: int, w: int) -> float:
        """The relative std of :meth:`predict` as an estimate of the job's mean
        speed at (p, w): of a seen shape's mean, the noise over the square root
        of its count; else the fitted form's uncertainty there."""
        n = self.observed_count(p, w)
        if n:
            return self.noise / math.sqrt(n)
        return min(self.relative_std(p, w), MAX_RELATIVE_STD)

    def spread(self, p: int, w: int) -> float:
        """The relative std of one new observation of (p, w) around the fitted
        form: the residual noise and the fit's uncertainty there (for a fleet
        prior, the noise includes how much jobs of the kind differ)."""
        return math.hypot(self.noise, self.relative_std(p, w))

    def confident(self, min_ps: int, max_ps: int, min_workers: int, max_workers: int) -> bool:
        """Seen something, and no shape within the limits is worth probing."""
        return self.theta is not None and not self.probes(min_ps, max_ps, min_workers, max_workers, count=1)


def fleet_prior(batch_size: int, observations: list[Observation], mode: str = "sync") -> SpeedModel:
    """The model of a kind of job, fitted on the newest :data:`PRIOR_TOTAL` of
    ``observations`` (each job's newest :data:`PRIOR_PER_JOB`, pooled). Every
    observation of a shape counts: the cap that keeps one job's model on its
    latest reports would, on a pool, throw away what other jobs measured there."""
    return SpeedModel(batch_size, mode, weight_cap=None).fit(observations[-PRIOR_TOTAL:])


def _replicate_noise(groups: dict[_Key, list[float]]) -> float | None:
    """The relative std of one step time about the mean of its own row (shape,
    nodes, batch and traffic: ``groups``), from rows observed more than once
    (one degree of freedom each spent on its mean), at least
    :data:`NOISE_FLOOR`; None if no row was observed twice."""
    repeated = [np.asarray(g) for g in groups.values() if len(g) > 1]
    if not repeated:
        return None
    squares = sum(float(np.sum(np.square(g / g.mean() - 1.0))) for g in repeated)
    dof = sum(len(g) - 1 for g in repeated)
    return max(NOISE_FLOOR, math.sqrt(squares / dof))

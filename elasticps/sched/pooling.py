"""The pooled curve of a fleet prior: a speed model of a kind of job fitted on
every job's reports of it (:func:`elasticps.sched.speed.fleet_prior`).

A fleet prior's curve (:meth:`SpeedModel.pooled`) is not its form alone: many
jobs' reports of one shape measure the kind's speed there without the form's
bias, where the form misses (on surfaces it was not made for, such as a
measured grid). The spread of reports about their own shape's mean is the
report noise (:attr:`SpeedModel.replicate_noise`); the residual noise beyond
it is how far the form misses a shape's mean (its misfit). Where the kind
measured a shape, its mean and the form are weighted by their precisions:
the mean's, its count over the report noise squared; the form's, one over its
misfit squared plus its uncertainty there. A form that fits (misfit near 0)
keeps its word; one that misses gives way to the means.

:class:`PooledCurve` is that part of :class:`~elasticps.sched.speed.SpeedModel`
(every model has it; the policy asks it of fleet priors only).
"""

from __future__ import annotations

import math

IDENTIFIED_SHAPES = 5  # distinct shapes a pooled model needs (and both kinds varied)
PRIOR_PER_JOB = 20  # a fleet prior pools each job's newest observations, this many,
PRIOR_TOTAL = 2000  # and the newest this many of those
MIN_MISFIT = 0.01  # a fleet prior's form is taken to miss a shape's mean by at least this (relative)


class PooledCurve:
    """The pooled curve of a fitted :class:`~elasticps.sched.speed.SpeedModel`
    (a base of it), from its fit: its noise, the shapes it saw, its form
    (``form``), its means of observed shapes (``observed``,
    ``observed_count``) and its uncertainty (``relative_std``)."""

    noise: float
    replicate_noise: float | None
    shapes: set[tuple[int, int]]
    _best_pooled: float | None
    _pooled: dict[tuple[int, int], tuple[float, float]]  # (speed, relative std) of pooled()

    def pooled(self, p: int, w: int) -> float:
        """A fleet prior's curve at (p, w) (see the module's docstring): where
        the kind measured the shape on the nodes it would span, its mean there
        and the form, weighted by their precisions; elsewhere the form."""
        return self._pooled_at(p, w)[0]

    def pooled_sd(self, p: int, w: int) -> float:
        """The relative std of :meth:`pooled` as the kind's mean speed at (p, w)
        (inf where nothing tells it: nothing fitted, or w < 1)."""
        return self._pooled_at(p, w)[1]

    def _pooled_at(self, p: int, w: int) -> tuple[float, float]:
        if (p, w) not in self._pooled:
            form, mean, sd = self.form(p, w), self.observed(p, w), self.relative_std(p, w)
            rep = self.report_noise
            fitted = 1.0 / (max(self.noise**2 - rep**2, MIN_MISFIT**2) + sd**2)  # the form's precision
            kind = self.observed_count(p, w) / rep**2 if mean is not None and form > 0 else 0.0
            speed = (kind * mean + fitted * form) / (kind + fitted) if kind else form
            precision = kind + fitted  # 0 where the form has no speed and the kind no mean
            self._pooled[(p, w)] = speed, 1.0 / math.sqrt(precision) if precision > 0 else math.inf
        return self._pooled[(p, w)]

    @property
    def report_noise(self) -> float:
        """The relative std of one report about its shape's mean:
        :attr:`replicate_noise` where a shape was reported twice, else the fit's noise."""
        return self.replicate_noise if self.replicate_noise is not None else self.noise

    def best_pooled_measured(self) -> float:
        """The fastest :meth:`pooled` among the shapes measured (what a shape far
        from them may count at most, :mod:`elasticps.sched.reach`)."""
        if self._best_pooled is None:
            self._best_pooled = max((self.pooled(p, w) for p, w in self.shapes), default=0.0)
        return self._best_pooled

    @property
    def identified(self) -> bool:
        """Enough distinct shapes, varying both kinds, to tell every term of the
        form apart (what a fleet prior pooled over many jobs needs to be used).
        A kind with no PS (all-reduce: p is always 0) varies only its workers."""
        ps = {p for p, _ in self.shapes}
        return (
            len(self.shapes) >= IDENTIFIED_SHAPES
            and (len(ps) > 1 or ps == {0})
            and len({w for _, w in self.shapes}) > 1
        )

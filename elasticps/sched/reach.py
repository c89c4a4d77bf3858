"""Which shapes a job's measurements back: where a learned speed is data, not extrapolation.

A fitted form is sure of itself far from its data: fitted on a few small
shapes, it can call a far corner the best, and on a measured grid such a
never-measured corner ran at a fraction of what the form said (issue 32: one
predicted 2.7x what it measured; in the simulator under ``--truth grid``, jobs
started at 1 PS x 15 workers, 0.19 of their best, on the form's word). So a
shape counts as known only within :data:`REACH` of one measured (at least one
task either way), and a shape beyond counts no faster than the fastest
measured (:func:`capped`): a job is not moved there on the form's word (a new
job of a kind may start there: :mod:`elasticps.sched.view`). It can still get
there by a probe (:meth:`SpeedModel.probes` ranks every shape not
measured: keeping probes within reach lost more on the measured grid, see
docs/simulator.md).
"""

from __future__ import annotations

import functools

from elasticps.sched.types import SpeedFn

#: A shape within this share of a measured one's counts, per kind of task (at least 1), is near it.
REACH = 0.5


@functools.lru_cache(maxsize=4096)
def near(shapes: frozenset[tuple[int, int]]) -> frozenset[tuple[int, int]]:
    """The shapes within :data:`REACH` of one of ``shapes`` (those included)."""
    out: set[tuple[int, int]] = set()
    for p0, w0 in shapes:
        dp, dw = max(1, round(REACH * p0)), max(1, round(REACH * w0))
        out.update((p, w) for p in range(max(0, p0 - dp), p0 + dp + 1) for w in range(max(1, w0 - dw), w0 + dw + 1))
    return frozenset(out)


def capped(speed: SpeedFn, reach: frozenset[tuple[int, int]], cap: float) -> SpeedFn:
    """``speed``, but no faster than ``cap`` (the fastest measured) outside ``reach``."""

    def within(p: int, w: int) -> float:
        v = speed(p, w)
        return v if (p, w) in reach else min(v, cap)

    return within

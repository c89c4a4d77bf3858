"""One job's bad figures fail that job, not the scheduling round.

A job's figures come from its spec, from what its program says of itself
(epochs, samples per epoch) and from its reports (speeds). Figures that are
out of range make the speed fit, the policy or placement raise (an
``OverflowError`` from a float of a huge integer, a ``ValueError`` from a
NaN), and a round that raised started no job at all. So the round isolates
each job: a job whose view cannot be built is set aside, and when deciding
raises, each job is decided alone to find the ones that make it raise; those
are set aside with the error, the rest decided again.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TypeVar

from elasticps.runtime import WindowReport
from elasticps.sched import JobView

#: What a job's bad figures make the scheduler's arithmetic raise.
FIGURE_ERRORS = (ArithmeticError, ValueError, TypeError)
#: The largest integer a figure may be: what a float holds exactly.
MAX_INT = 2**53

T = TypeVar("T")


def window_problem(w: WindowReport) -> str | None:
    """Why a job's progress window cannot be a speed observation (None: it can)."""
    value = w.samples_per_s
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        return f"it reported samples_per_s = {value!r}, not a finite number >= 0"
    if w.cross is not None and not (isinstance(w.cross, (int, float)) and 0 <= w.cross <= 1):
        return f"it reported a cross-node share of {w.cross!r}, not a number from 0 to 1"
    for name in ("last_step", "num_ps", "num_workers", "batch_size", "nodes"):
        value = getattr(w, name)
        if not isinstance(value, int) or not 0 <= value <= MAX_INT:
            return f"it reported {name} = {value!r}, not an integer from 0 to 2**53"
    return None


def decide_isolated(
    decide: Callable[[list[JobView]], T], views: list[JobView]
) -> tuple[T, list[JobView], dict[str, str]]:
    """``decide(views)``; if it raises on a job's figures, the jobs that make it
    raise when decided alone are left out (with their error) and the rest
    decided again. Returns the result, the views it was made on, and the jobs
    left out. An error no single job causes is raised."""
    try:
        return decide(views), views, {}
    except FIGURE_ERRORS as first:
        culprits: dict[str, str] = {}
        for view in views:
            try:
                decide([view])
            except FIGURE_ERRORS as exc:
                culprits[view.id] = f"{type(exc).__name__}: {exc}"
        if not culprits:
            raise first
        kept = [v for v in views if v.id not in culprits]
        return decide(kept), kept, culprits

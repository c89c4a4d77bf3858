"""Two kinds of scheduling round, for every driver (the live manager, the simulator).

A **full** round (every interval, and when other tenants take or free room or
a job's limits change) may start, grow, shrink or move any job. A round on a
job's **arrival or end** only starts waiting jobs in the room that is free:
running jobs keep their shapes until the next full round. Reacting to each
arrival by shrinking running jobs, and to each end by growing them, moved
jobs back and forth within minutes, each move a pause; a waiting job still
starts as soon as room for it is free. Placement may still move a spread
running job onto fewer nodes that the end of another freed (compaction: it
lowers the job's span, and no arrival undoes it, since running jobs keep
their nodes while they have room; in the simulator it was worth 10% of the
contended workload's avg JCT). Of the policy's state, what counts rounds (how
many full rounds a job has wished to shrink) is carried only by full rounds;
what accounts time (Tiresias's service and waiting) by every round
(:func:`state_after`).

The pin holds running jobs' shapes, not their places: a policy that stops a
running job for a waiting one does so in these rounds too. Tiresias does
(its least-attained-service rule puts a new job ahead of one that has run,
as the paper's scheduler does on an arrival); elastic and greedy admit
running jobs first and never do.

Pure code: a driver pins the views it hands the policy.
"""

from __future__ import annotations

import dataclasses

from elasticps.sched.policies.base import PolicyState
from elasticps.sched.types import JobView


def admission_only(views: list[JobView]) -> list[JobView]:
    """``views`` with every running job held at its current shape (no growth,
    no shrink, no probe): a policy deciding on them can only start waiting jobs."""
    return [_held(v) if v.current is not None else v for v in views]


def _held(view: JobView) -> JobView:
    p, w = view.current  # type: ignore[misc]
    return dataclasses.replace(view, min_ps=p, max_ps=p, min_workers=w, max_workers=w, explore=None, probes=())


def state_after(old: PolicyState | None, new: PolicyState, full: bool) -> PolicyState:
    """The policy state to carry into the next round: a full round's whole; an
    admission round's with the shrink wishes of before (pinned jobs wish
    nothing, which would reset the count)."""
    if full:
        return new
    return dataclasses.replace(new, shrink_wishes=dict(old.shrink_wishes) if old is not None else {})

"""A bounded joint search over jobs after a greedy allocation: trades of tasks.

Greedy growth gives one task (or a short jump of them) at a time to the job
whose next step gains the most per share of the cluster, and never takes one
back. Where utilities are not concave in the tasks (a shape that spans one
more node is slower), where tasks differ in size and in kind of resource, and
where growth ran in phases (a fair target, then what held jobs left), its
result can leave a task with a job that gains less from it than another would.
The search looks for such trades: a *donor* gives up one step of its shape
(one or a few PS, workers or both) and a *receiver* takes one, in the room
left plus what the donor frees, when the receiver's gain is larger than the
donor's loss (in the same utility the greedy weighs: log speed, so a job at
half speed gains more from a task than a fast one with the same absolute
speed-up; the sum of it over jobs is proportional fairness). Each trade it
makes raises that sum by at least ``min_net``, so it never cycles; it stops
at the first round where no trade among the best candidates pays, or after
``budget`` trades (policies have no clock: the count bounds the decision's
time, with one pass over the jobs before the first).

Who may give and take is the caller's rule (``floor``, ``cap``, ``may_take``
and ``may_give``): the elastic policy keeps a running job at or above its
current shape or its decided one (no shrink its hysteresis did not pass) and
moves a running job only where the move pays for its rescale. Pure code.
"""

from __future__ import annotations

import functools
import heapq
from collections.abc import Callable
from dataclasses import dataclass

from elasticps.sched.types import Decision, JobView, Resources, tasks_of

Shape = tuple[int, int]
#: log-utility gain of going from the first shape to the second (negative: a loss)
Gain = Callable[[JobView, Shape, Shape], float]
#: whether a job may take (or give) the step from the first shape to the second
#: (the gain is not noise, the rescale pays)
Allowed = Callable[[JobView, Shape, Shape], bool]

#: How many of the best receivers and of the best donors are paired at each trade.
WIDTH = 6


@dataclass
class Outcome:
    """What a search did: trades made, steps whose gain it weighed, the sum of
    log-utility it added."""

    trades: int = 0
    evaluations: int = 0
    gained: float = 0.0


def trade(
    jobs: list[JobView],
    decision: Decision,
    left: Resources,
    total: Resources,
    gain: Gain,
    floor: dict[str, Shape],
    cap: dict[str, Shape],
    may_take: Allowed,
    may_give: Allowed,
    jumps: tuple[int, ...] = (1,),
    budget: int = 32,
    min_net: float = 0.01,
) -> tuple[Decision, Resources, Outcome]:
    """At most ``budget`` trades of tasks between the jobs of ``floor`` (each
    kept at or above its floor and at or below its cap, per kind, by steps it
    may take or give) that raise the sum of ``gain`` by at least ``min_net``
    each. Weighs each job's steps once, then only the two jobs of each trade
    again: at most ``6 x len(jumps)`` gains a job plus ``12 x len(jumps)`` a
    trade. Returns the new decision (a copy), the room left, and what was done."""
    by_id = {j.id: j for j in jobs}
    decision = dict(decision)
    out = Outcome()
    # every step of every job, best first; a job's entries are dropped when its shape changes (version)
    ups: list[tuple[float, str, int, Shape, float]] = []  # (-gain per share, id, version, new, gain)
    downs: list[tuple[float, str, int, Shape, float]] = []  # (loss per share, id, version, new, loss)
    version: dict[str, int] = {}

    def push(job_id: str) -> None:
        """The job's steps up (most gain per share first) and down (least loss
        per share first) from its shape; whether it may make them is asked
        only of those that come to the top (:func:`top`)."""
        version[job_id] = version.get(job_id, 0) + 1
        job, shape = by_id[job_id], decision[job_id]
        lo, hi = floor[job_id], cap[job_id]
        for (dp, dw), (need, share) in sizes[job_id].items():
            up, down = (shape[0] + dp, shape[1] + dw), (shape[0] - dp, shape[1] - dw)
            if up[0] <= hi[0] and up[1] <= hi[1] and not need.fits_in(left):  # what fits needs no donor
                out.evaluations += 1
                g = gain(job, shape, up)
                if g > 0:
                    heapq.heappush(ups, (-g / share, job_id, version[job_id], up, g))
            if down[0] >= lo[0] and down[1] >= lo[1]:
                out.evaluations += 1
                loss = -gain(job, shape, down)
                heapq.heappush(downs, (max(loss, 0.0) / share, job_id, version[job_id], down, loss))

    def top(heap: list, count: int, rule: Allowed) -> list:
        """The ``count`` best entries of ``heap`` that are current and that
        ``rule`` allows (the others are dropped for good: a job's shape, and so
        the rule's answer, changes only with a new version)."""
        found: list = []
        while heap and len(found) < count:
            entry = heapq.heappop(heap)
            _, job_id, ver, new, _ = entry
            if version[job_id] == ver and rule(by_id[job_id], decision[job_id], new):
                found.append(entry)
        for entry in found:
            heapq.heappush(heap, entry)
        return found

    def size(job_id: str, a: Shape, b: Shape) -> Resources:
        """What going from ``a`` to ``b`` (larger per kind) adds."""
        return sizes[job_id][(b[0] - a[0], b[1] - a[1])][0]

    def take(job: JobView, shape: Shape, new: Shape) -> bool:
        """A receiver's step: one that needs a donor (room grows with trades), and may take."""
        return not size(job.id, shape, new).fits_in(left) and may_take(job, shape, new)

    if all(decision[job_id] == floor[job_id] for job_id in floor):  # nobody has a task to give
        return decision, left, out
    sizes = {
        job_id: _step_sizes(by_id[job_id].ps_resources, by_id[job_id].worker_resources, jumps, total)
        for job_id in floor
    }
    for job_id in sorted(floor):
        push(job_id)
    while out.trades < budget:
        best = None
        donors = top(downs, WIDTH, may_give)
        for _, r_id, _, r_new, r_gain in top(ups, WIDTH, take):
            r_need = size(r_id, decision[r_id], r_new)
            for _, d_id, _, d_new, d_loss in donors:
                net = r_gain - d_loss
                if d_id == r_id or net < min_net or (best is not None and net <= best[0]):
                    continue
                if r_need.fits_in(left + size(d_id, d_new, decision[d_id])):
                    best = (net, r_id, r_new, d_id, d_new)
        if best is None:
            break
        net, r_id, r_new, d_id, d_new = best
        left = left + size(d_id, d_new, decision[d_id]) - size(r_id, decision[r_id], r_new)
        decision[r_id], decision[d_id] = r_new, d_new
        out.trades += 1
        out.gained += net
        push(r_id)
        push(d_id)
    return decision, left, out


@functools.lru_cache(maxsize=1024)
def _step_sizes(
    ps: Resources, worker: Resources, jumps: tuple[int, ...], total: Resources
) -> dict[Shape, tuple[Resources, float]]:
    """Each step a job with tasks of these sizes may take or give, (more PS,
    more workers), with what it takes and its dominant share of ``total``
    (the same at every shape; jobs share a few task sizes)."""
    out = {}
    for d in jumps:
        for step in ((0, d), (d, 0), (d, d)):
            need = tasks_of(ps, worker, *step)
            out[step] = (need, max(need.dominant_share(total), 1e-9))
    return out

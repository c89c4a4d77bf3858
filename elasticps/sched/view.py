"""What a policy may choose for a job this round, from what is known of its
speed: one rule for the live manager and the simulator.

- Its own model is confident (nothing within the limits worth probing, see
  :meth:`SpeedModel.probes`): any shape within its limits, judged by that model.
- Not yet, but a fleet prior (a model fitted on jobs of the same kind) has
  seen enough shapes to tell its terms apart (:attr:`SpeedModel.identified`):
  any shape, judged by the prior's curve (:meth:`SpeedModel.pooled`: the
  kind's mean where it measured the shape and its form disagree by more
  than the reports vary, else the form) at the job's own level (how much
  faster or slower than its kind it ran where it ran), combined where the
  job has run a shape with its own mean there, each weighted by its
  precision (one noisy epoch does not outweigh what hundreds of the kind's
  say). A new job starts at the best of its own draw of the prior's curve
  (keyed by its id: see :func:`_own_else`), not at its minimum, and moves
  to its target in one rescale.
- Nothing known: the shape the user asked for (``start``), or the minimum.
- Some shapes seen, no confident model: up to the current shape or the probes
  (best first; the policy takes the first that fits in the room left).

A job's own best mean seen, if of one run and better than where the job is,
is its first probe (measured again): a single lucky pass would otherwise
decide its shape for good. Every plan names the shapes the job has run
(``ViewPlan.measured``), where its speeds are data: growth may leap to them.

Wherever a model judges, a shape far from every one measured (by the job,
or under a fleet prior by its kind too) counts no faster than the fastest
measured (:mod:`.reach`): it is reached by probes, not chosen on the form's
word. One exception: a new job's draw of its kind's curve is not capped, so
that new jobs, which must start somewhere and pay no rescale to start there,
are how a kind learns the shapes beyond what its jobs ran.

At another global batch (adaptive jobs), the speed is scaled by the job's own
fitted form, else the prior's (:meth:`SpeedModel.batch_ratio`).

Each plan also says how sure its speeds are (``ViewPlan.sd``, relative std):
a job's own model, :meth:`SpeedModel.estimate_sd`; under a fleet prior, a
shape the job ran has the precision of its own mean and the prior's
together, and one it did not, the prior's curve's (:meth:`SpeedModel.pooled_sd`).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any

from elasticps.sched.reach import capped, near
from elasticps.sched.speed import MAX_RELATIVE_STD, SpeedModel
from elasticps.sched.types import BatchSpeedFn, SpeedFn

#: Probes offered to the policy, best first: it takes the first that fits.
PROBES = 8
#: A new job's draw of its kind's curve strays by this many of the curve's standard errors (x a normal deviate).
DRAW_SPREAD = 0.25


@dataclass(frozen=True)
class ShapeLimits:
    min_ps: int
    max_ps: int
    min_workers: int
    max_workers: int

    def clip(self, shape: tuple[int, int]) -> tuple[int, int]:
        return (
            min(self.max_ps, max(self.min_ps, shape[0])),
            min(self.max_workers, max(self.min_workers, shape[1])),
        )

    def astuple(self) -> tuple[int, int, int, int]:
        return self.min_ps, self.max_ps, self.min_workers, self.max_workers


@dataclass(frozen=True)
class ViewPlan:
    speed: SpeedFn
    limits: ShapeLimits
    probes: tuple[tuple[int, int], ...] = ()
    speed_at: BatchSpeedFn | None = None
    sd: SpeedFn | None = None  # the relative std of speed(p, w) as an estimate
    measured: tuple[tuple[int, int], ...] = ()  # shapes the job ran, where its speed is measured

    @property
    def explore(self) -> tuple[int, int] | None:
        return self.probes[0] if self.probes else None

    def fields(self) -> dict[str, Any]:
        """The :class:`~elasticps.sched.types.JobView` fields this plan decides
        (speed, limits, probes), the same for every driver."""
        return {
            "speed": self.speed,
            "min_ps": self.limits.min_ps,
            "max_ps": self.limits.max_ps,
            "min_workers": self.limits.min_workers,
            "max_workers": self.limits.max_workers,
            "explore": self.explore,
            "probes": self.probes,
            "speed_at": self.speed_at,
            "speed_sd": self.sd,
            "measured": self.measured,
        }


def _deviate(key: str, p: int, w: int) -> float:
    """A standard normal deviate fixed by ``(key, p, w)``: a job's draw is the
    same in every round and every driver (Box-Muller on a hash)."""
    h = hashlib.blake2b(f"{key}:{p}:{w}".encode(), digest_size=8).digest()
    u1 = (int.from_bytes(h[:4], "big") + 0.5) / 2**32
    u2 = (int.from_bytes(h[4:], "big") + 0.5) / 2**32
    return math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)


def _own_else(model: SpeedModel, prior: SpeedModel, draw: str | None = None) -> tuple[SpeedFn, SpeedFn]:
    """The job is its kind, scaled: the prior's curve (:meth:`SpeedModel.pooled`)
    times how much faster the job ran than that curve says at the shapes it
    has run (the geometric mean of its own means over the curve's, weighted by
    count), so that a job faster or slower than its kind is judged by its
    kind's curve at its own level. Where the job has a mean, that mean and the
    scaled prediction are weighted by their precisions: the own mean of n
    observations by n / noise^2 (its noise at least the kind's report noise:
    a job with a few reports cannot tell its own), the prediction as one more
    report about the curve (its uncertainty and the report noise).

    ``draw``: a job that has run nowhere yet is judged by a draw of the curve
    keyed by it (each shape's value times exp(:data:`DRAW_SPREAD` x its
    relative std x a deviate fixed by the key and the shape)), so that new jobs
    of a kind start spread over the shapes the kind's data leave possibly
    best, not all at the curve's best (Thompson sampling, with each shape
    drawn apart rather than the form's parameters drawn together: the best of
    many unsure shapes leans high): the kind's data then grow where its curve
    is unsure. The draw is not capped where the kind measured nothing near
    (else the kind's jobs never leave the shapes its first jobs ran, and a
    form that misses a measured surface there is never corrected); the
    spread is small, as the uncapped curve reaches far enough. Once the job
    has run, the curve itself judges it, capped."""
    rep = prior.report_noise
    logs = [(n, math.log(v / g)) for p, w, v, n in model.seen_at_span() if (g := prior.pooled(p, w)) > 0 and v > 0]
    count = sum(n for n, _ in logs)
    scale = math.exp(sum(n * r for n, r in logs) / count) if count else 1.0
    noise = max(model.noise, rep)

    def precisions(p: int, w: int) -> tuple[float, float]:
        """Of the job's own mean at (p, w), and of the prior's scaled prediction there."""
        return model.observed_count(p, w) / noise**2, 1.0 / (prior.pooled_sd(p, w) ** 2 + rep**2)

    drawn = draw is not None and not model.shapes

    def curve(p: int, w: int) -> float:
        v = scale * prior.pooled(p, w)
        if drawn and v > 0:
            v *= math.exp(DRAW_SPREAD * min(prior.pooled_sd(p, w), MAX_RELATIVE_STD) * _deviate(draw, p, w))
        return v

    prior_guess = curve  # a new job's draw is not capped (see above)
    if not drawn:  # a shape far from all the job and its kind measured counts no faster than the fastest measured
        ceiling = max(scale * prior.best_pooled_measured(), model.best_seen)
        prior_guess = capped(curve, near(frozenset(model.shapes | prior.shapes)), ceiling)

    def speed(p: int, w: int) -> float:
        guess = prior_guess(p, w)
        seen = model.observed(p, w)
        if seen is None or guess <= 0:
            return guess if seen is None else seen
        own, other = precisions(p, w)
        return (own * seen + other * guess) / (own + other)

    def sd(p: int, w: int) -> float:
        if model.observed(p, w) is None:
            return min(prior.pooled_sd(p, w), MAX_RELATIVE_STD)
        own, other = precisions(p, w)
        return 1.0 / math.sqrt(own + other)

    return speed, sd


def _doubted(
    model: SpeedModel, limits: ShapeLimits, current: tuple[int, int] | None, own: SpeedFn
) -> tuple[tuple[int, int], ...]:
    """The shape to measure again first: the best mean seen, of one run
    (:meth:`SpeedModel.unconfirmed_best`), where it would beat the job's
    current shape (else the job is better off where it is, whatever that pass
    was worth). One lucky pass otherwise decides a job's shape for good."""
    if current is None:
        return ()
    best = model.unconfirmed_best(*limits.astuple())
    return (best,) if best is not None and best != current and own(*best) > own(*current) else ()


def plan_view(
    model: SpeedModel,
    limits: ShapeLimits,
    current: tuple[int, int] | None,
    start: tuple[int, int] | None = None,
    prior: SpeedModel | None = None,
    draw: str | None = None,
) -> ViewPlan:
    """The speed function and the range of shapes a policy may choose from for
    one job (see the module's docstring); ``prior`` counts only if identified;
    ``draw``: the key of a new job's draw of the prior's curve (its id)."""
    plan = _plan(model, limits, current, start, prior, draw)
    scaler = model if model.theta is not None or prior is None else prior
    measured = tuple(sorted((p, w) for p, w, _, _ in model.seen_at_span()))
    return ViewPlan(plan.speed, plan.limits, plan.probes, _at_batch(plan.speed, scaler), plan.sd, measured)


def _at_batch(speed: SpeedFn, scaler: SpeedModel) -> BatchSpeedFn:
    def speed_at(p: int, w: int, batch: int) -> float:
        return speed(p, w) * scaler.batch_ratio(p, w, batch)

    return speed_at


def _plan(
    model: SpeedModel,
    limits: ShapeLimits,
    current: tuple[int, int] | None,
    start: tuple[int, int] | None,
    prior: SpeedModel | None,
    draw: str | None,
) -> ViewPlan:
    own = capped(model.predict, near(frozenset(model.shapes)), model.best_seen)  # no far corner on the form's word
    if model.confident(*limits.astuple()):
        return ViewPlan(own, limits, _doubted(model, limits, current, own), sd=model.estimate_sd)
    if prior is not None and prior.identified:
        speed, sd = _own_else(model, prior, draw)
        return ViewPlan(speed, limits, sd=sd)
    if not model.shapes:
        p, w = limits.clip(start) if start is not None else (limits.min_ps, limits.min_workers)
        return ViewPlan(model.predict, ShapeLimits(p, p, w, w))
    probes: tuple[tuple[int, int], ...] = ()
    if current is not None:  # the best seen once first, then what the model would learn most from
        probes = (*_doubted(model, limits, current, own), *model.probes(*limits.astuple(), count=PROBES))
    if not probes:
        return ViewPlan(own, limits, sd=model.estimate_sd)
    assert current is not None
    grown = ShapeLimits(
        limits.min_ps,
        max(current[0], *(s[0] for s in probes)),
        limits.min_workers,
        max(current[1], *(s[1] for s in probes)),
    )
    return ViewPlan(own, grown, probes, sd=model.estimate_sd)

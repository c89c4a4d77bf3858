"""What a policy may choose for a job this round, from what is known of its
speed: one rule for the live manager and the simulator.

- Its own model is confident: any shape within its limits, judged by that model.
- Not yet, but a fleet prior (a model fitted on jobs of the same kind) is:
  any shape, judged by the prior. A new job starts at the prior's best, not
  at its minimum, and moves to its target in one rescale.
- Nothing known: the shape the user asked for (``start``), or the minimum.
- Some shapes seen, no confident model: the current shape or one exploration
  step beyond it (:meth:`SpeedModel.explore`).
"""

from __future__ import annotations

from dataclasses import dataclass

from elasticps.sched.speed import SpeedModel
from elasticps.sched.types import SpeedFn


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


@dataclass(frozen=True)
class ViewPlan:
    speed: SpeedFn
    limits: ShapeLimits
    explore: tuple[int, int] | None = None


def plan_view(
    model: SpeedModel,
    limits: ShapeLimits,
    current: tuple[int, int] | None,
    start: tuple[int, int] | None = None,
    prior: SpeedModel | None = None,
) -> ViewPlan:
    """The speed function and the range of shapes a policy may choose from for
    one job (see the module's docstring); ``prior`` counts only if confident."""
    if model.confident:
        return ViewPlan(model.predict, limits)
    if prior is not None and prior.confident:
        return ViewPlan(prior.predict, limits)
    if not model.shapes:
        p, w = limits.clip(start) if start is not None else (limits.min_ps, limits.min_workers)
        return ViewPlan(model.predict, ShapeLimits(p, p, w, w))
    explore = model.explore(current, limits.max_ps, limits.max_workers) if current is not None else None
    if explore is None:
        return ViewPlan(model.predict, limits)
    assert current is not None
    grown = ShapeLimits(limits.min_ps, max(current[0], explore[0]), limits.min_workers, max(current[1], explore[1]))
    return ViewPlan(model.predict, grown, explore)

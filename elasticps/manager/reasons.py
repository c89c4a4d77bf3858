"""Why each job got what a round gave it: the words of events, ``describe``
and the dashboard's decision list.

Pure code: the round's job views, the policy's decision, the shapes placement
kept, and the reasons some jobs can never fit go in; one :class:`Move` per
job comes out. Nothing here reads the clock or the store.

The actions:

- ``admit``: a waiting job starts; ``wait``: it does not (no room now);
  ``unfit``: it never can here (``cannot fit: ...``);
- ``keep``: a running job stays as it is;
- ``probe``: it moves to a shape its speed model is unsure of, to measure it;
- ``grow`` / ``shrink`` (``shrink for job X``: room it gives up went to X);
  ``reshape``: as many tasks, split otherwise between PS and workers;
- ``unplaced``: the policy wanted a new shape that placement could not fit on
  the nodes, so the job keeps its shape.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from elasticps.sched import ClusterView, JobView, Resources
from elasticps.sched.fit import describe
from elasticps.sched.objectives import Objective, objective_of, utility_at_batch
from elasticps.sched.types import total_of
from elasticps.tables import shape_text

ACTIONS = ("admit", "wait", "unfit", "keep", "probe", "grow", "shrink", "reshape", "unplaced")


@dataclass(frozen=True)
class Move:
    job: str
    action: str  # one of ACTIONS
    shape: tuple[int, int] | None  # what the job was given (None: nothing)
    why: str  # in short: "grow", "shrink for job b", "probe", ...
    text: str  # the whole sentence users read

    def as_dict(self) -> dict:
        return {"job": self.job, "action": self.action, "shape": self.shape, "why": self.why, "text": self.text}


def explain(
    views: list[JobView],
    decision: Mapping[str, tuple[int, int]],
    placed: Mapping[str, tuple[int, int]],
    unfit: Mapping[str, str],
    cluster: ClusterView,
) -> dict[str, Move]:
    """One move per job of ``views``: what it was given (``placed``, the shapes
    placement kept of ``decision``) and why."""
    gainers = sorted(
        v.id for v in views if v.id in placed and (v.current is None or _tasks(placed[v.id]) > _tasks(v.current))
    )
    given = total_of(v.resources(*placed[v.id]) for v in views if v.id in placed)
    left = (cluster.available - given).clamped()
    moves = {}
    for view in views:
        moves[view.id] = _move(view, decision.get(view.id), placed.get(view.id), unfit.get(view.id), gainers, left)
    return moves


def _move(
    view: JobView,
    wanted: tuple[int, int] | None,
    given: tuple[int, int] | None,
    unfit: str | None,
    gainers: list[str],
    left: Resources,
) -> Move:
    cur = view.current
    if cur is None:
        if given is not None:
            probe = " to measure its speed" if given in (view.explore, *view.probes) else ""
            return Move(view.id, "admit", given, "admit", f"admit at {_shape(given)}{probe}")
        if unfit:
            return Move(view.id, "unfit", None, "cannot fit", unfit)
        need = view.resources(view.min_ps, view.min_workers)
        return Move(
            view.id, "wait", None, "waits for room",
            f"waits for room: its smallest shape ({_shape((view.min_ps, view.min_workers))}) needs {describe(need)}; "
            f"{describe(left)} left after this round's shapes",
        )  # fmt: skip
    if given is None or given == cur:
        if wanted is not None and wanted != cur:
            return Move(
                view.id, "unplaced", cur, "unplaced", f"keeps {_shape(cur)}: {_shape(wanted)} did not fit on the nodes"
            )
        return Move(view.id, "keep", cur, "keep", f"keeps {_shape(cur)}")
    to = f"{_shape(cur)} -> {_shape(given)}"
    if not (view.min_ps <= cur[0] <= view.max_ps and view.min_workers <= cur[1] <= view.max_workers):
        action = "grow" if _tasks(given) > _tasks(cur) else "shrink" if _tasks(given) < _tasks(cur) else "reshape"
        limits = f"PS {view.min_ps}..{view.max_ps}, workers {view.min_workers}..{view.max_workers}"
        return Move(view.id, action, given, "new limits", f"new limits {to}: {_shape(cur)} is outside {limits}")
    if given in (view.explore, *view.probes):
        return Move(view.id, "probe", given, "probe", f"probe {to}: measuring a shape its speed model is unsure of")
    if _tasks(given) > _tasks(cur):
        return Move(view.id, "grow", given, "grow", f"grow {to}")
    if _tasks(given) < _tasks(cur):
        others = [g for g in gainers if g != view.id]
        why = f"shrink for job{'s' if len(others) > 1 else ''} {', '.join(others)}" if others else "shrink"
        return Move(view.id, "shrink", given, why, f"{why} {to}")
    return Move(view.id, "reshape", given, "reshape", f"reshape {to}")


def _tasks(shape: tuple[int, int]) -> int:
    return shape[0] + shape[1]


def _shape(shape: tuple[int, int]) -> str:
    return shape_text(*shape)


def batch_reason(job: JobView, shape: tuple[int, int], batch: int, default: Objective | str) -> str:
    """Why an adaptive job's global batch changes: ``batch 512: speed 9100 samples/s at
    1x4, against 4200 at batch 64`` (goodput and efficiency: the goodput, with the
    noise scale it was weighed at)."""
    objective = objective_of(job, Objective.parse(default))
    p, w = shape
    old = job.batch or job.batch_sizes[0]
    new_u, old_u = (utility_at_batch(job, p, w, b, objective) for b in (batch, old))
    unit = "samples/s" if objective is Objective.SPEED else "samples/s x efficiency"
    why = f"batch {batch}: {objective.value} {new_u:.0f} {unit} at {p}x{w}, against {old_u:.0f} at batch {old}"
    if objective is Objective.SPEED:
        return why
    return f"{why} (noise scale {'unknown' if job.noise_scale is None else f'{job.noise_scale:.0f}'})"

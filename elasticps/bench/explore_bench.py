"""``elasticps bench explore``: the scheduler's probe walk, replayed against a
grid of measured speeds (``elasticps bench shapes``).

One job alone on a cluster with room for the grid's largest shape (every task
1 CPU; ``max_tasks`` CPUs). Each round the job "runs" at its current shape and
reports that shape's measured speed (the measured passes in turn, so the
replay sees the real run-to-run variation), its :class:`SpeedModel` is
refitted, :func:`plan_view` says what the policy may choose, and the
``elastic`` policy (objective ``speed``) decides the next shape: the same code
the manager runs. After the walk has seen k distinct shapes, the *choice* is
the shape the policy would give the job from the model fitted so far with
exploration over (a new job on the empty cluster); its measured speed over the
grid's measured best is the figure. ``policy_knowing_grid`` is the same
policy deciding with the measured medians themselves: the most any model could
give it.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from elasticps.errors import ConfigError
from elasticps.sched import ClusterView, JobView, NodeView, Observation, PolicyState, Resources, SpeedModel
from elasticps.sched.policies import make_policy
from elasticps.sched.types import SpeedFn
from elasticps.sched.view import ShapeLimits, plan_view

JOB = "job"
Shape = tuple[int, int]
#: Shapes a user might ask for at submission: the walk starts there.
STARTS: tuple[Shape, ...] = ((1, 1), (1, 2), (1, 4), (2, 2), (2, 4))


def load_grid(path: str | Path) -> tuple[dict[Shape, list[float]], dict[Shape, int], dict[str, Any]]:
    """``{(p, w): [measured samples/s of each pass]}``, ``{(p, w): nodes its
    tasks were placed on}`` and the grid's workload note."""
    try:
        data = json.loads(Path(path).read_text())
        grid = [((int(g["ps"]), int(g["workers"])), g) for g in data["grid"]]
        runs = {shape: [float(v) for v in g["runs"]] for shape, g in grid}
        nodes = {shape: int(g.get("nodes", 1)) for shape, g in grid}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{path}: not a grid written by 'elasticps bench shapes' ({exc})") from None
    if not runs or any(not v or min(v) <= 0 for v in runs.values()):
        raise ConfigError(f"{path}: every shape of the grid needs at least one speed > 0")
    return runs, nodes, data.get("workload", {})


class _Replay:
    def __init__(self, runs: dict[Shape, list[float]], nodes: dict[Shape, int], batch: int) -> None:
        self.runs = runs
        self.nodes = nodes
        self.median = {s: statistics.median(v) for s, v in runs.items()}
        self.limits = ShapeLimits(
            min(p for p, _ in runs), max(p for p, _ in runs), min(w for _, w in runs), max(w for _, w in runs)
        )
        self.max_tasks = max(p + w for p, w in runs)
        self.cluster = ClusterView((NodeView("node", Resources(cpu=float(self.max_tasks))),))
        self.batch = batch
        self.policy = make_policy("elastic", objective="speed")

    def measured(self, shape: Shape) -> float:
        return self.median.get(shape, 0.0)

    def view(
        self,
        speed: SpeedFn,
        limits: ShapeLimits,
        current: Shape | None,
        probes: tuple[Shape, ...] = (),
        sd: SpeedFn | None = None,
        measured: tuple[Shape, ...] = (),
    ) -> JobView:
        return JobView(
            id=JOB,
            speed=speed,
            min_ps=limits.min_ps,
            max_ps=limits.max_ps,
            min_workers=limits.min_workers,
            max_workers=limits.max_workers,
            remaining_samples=1e9,
            current=current,
            probes=probes,
            speed_sd=sd,
            measured=measured,
        )

    def choice(self, speed: SpeedFn, sd: SpeedFn | None = None, measured: tuple[Shape, ...] = ()) -> Shape:
        """What the policy gives a new job judged by ``speed`` on the empty cluster."""
        decision, _ = self.policy.decide([self.view(speed, self.limits, None, sd=sd, measured=measured)], self.cluster)
        return decision[JOB]

    def walk(self, start: Shape, rounds: int, probes: list[int]) -> dict[str, Any]:
        model = SpeedModel(self.batch, span=lambda p, w: self.nodes.get((p, w), 1))
        observations: list[Observation] = []
        visits: dict[Shape, int] = {}
        state = PolicyState()
        current: Shape | None = None
        path: list[Shape] = []
        after: dict[int, Shape] = {}
        for _ in range(rounds):
            plan = plan_view(model, self.limits, current, start)
            decision, state = self.policy.decide(
                [self.view(plan.speed, plan.limits, current, plan.probes, plan.sd, plan.measured)], self.cluster, state
            )
            current = decision[JOB]
            path.append(current)
            if current not in self.runs:
                raise ValueError(f"the walk left the measured grid at {current}")
            k = visits.get(current, 0)
            visits[current] = k + 1
            runs = self.runs[current]
            observations.append(Observation(*current, runs[k % len(runs)], self.nodes[current]))
            model.fit(observations)
            seen = len(visits)
            if seen in probes and seen not in after:
                after[seen] = self.choice(model.predict, model.estimate_sd, tuple(visits))
        final = self.choice(model.predict, model.estimate_sd, tuple(visits))
        for k in probes:  # the walk stopped probing before k shapes: its choice stands
            after.setdefault(k, final)
        best = max(self.median.values())
        return {
            "start": list(start),
            "path": [list(s) for s in path],
            "shapes_probed": len(visits),
            "choice_after": {str(k): list(after[k]) for k in probes},
            "of_best_after": {str(k): self.measured(after[k]) / best for k in probes},
            "final_choice": list(final),
            "final_of_best": self.measured(final) / best,
        }


def run(
    grid_path: str | Path, probes: list[int] | None = None, rounds: int = 16, batch: int | None = None
) -> dict[str, Any]:
    probes = sorted(probes or [3, 5, 8])
    runs, nodes, workload = load_grid(grid_path)
    replay = _Replay(runs, nodes, batch or int(workload.get("global_batch", 256)))
    best_shape = max(replay.median, key=replay.median.__getitem__)
    walks = [replay.walk(start, rounds, probes) for start in STARTS if start in runs]
    knowing = replay.choice(lambda p, w: replay.median.get((p, w), 0.0), measured=tuple(sorted(runs)))
    best = replay.median[best_shape]
    return {
        "grid": str(grid_path),
        "workload": workload,
        "measured_best": {"ps": best_shape[0], "workers": best_shape[1], "samples_per_s": best},
        "policy_knowing_grid": {"shape": list(knowing), "of_best": replay.measured(knowing) / best},
        "walks": walks,
        "mean_of_best_after": {str(k): statistics.fmean(w["of_best_after"][str(k)] for w in walks) for k in probes},
        "min_of_best_after": {str(k): min(w["of_best_after"][str(k)] for w in walks) for k in probes},
        "rounds": rounds,
    }

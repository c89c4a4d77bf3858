"""Ground truths for the simulator that are not the form the speed model fits.

``--truth optimus`` (the default) is the Optimus form of
:func:`~elasticps.sched.synthetic.kind_speed`, the very form
:class:`~elasticps.sched.SpeedModel` fits. The other truths test learning on
surfaces it was not made for; each PS job follows one *surface*:

- ``saturation``: a node's PS bandwidth is shared by the shards on it. The
  PS-traffic term ``t2 (w/p) traffic`` is paid at the pace of the busiest
  node: x ``max(1, b / NIC_SHARDS)`` where ``b`` is the most shards on one
  node (a node serves :data:`NIC_SHARDS` shards at full speed, more share it).
  Adding shards on a full node no longer helps, and growth in workers stops
  early on one node's bandwidth.
- ``straggler``: a step waits for the slowest of its ``p`` shards and of its
  ``w`` workers. Each shard's reply is late by an exponential delay of mean
  ``PS_TAIL x t1``, so the step pays ``PS_TAIL t1 (H_p - 1)`` more than with
  one shard (``H_p``: the p-th harmonic number, the mean of the largest of p
  exponentials, ~ln p): more PS eventually slow the job. Each worker's
  compute varies likewise, by ``WORKER_TAIL`` of its mean: the compute term
  is x ``1 + WORKER_TAIL (H_w - 1)``.
- ``grid``: the speeds measured by ``elasticps bench shapes``
  (docs/results/bench-shapes.json: a 10M-parameter MLP, p <= 4, w <= 8,
  p + w <= 10), read with :func:`~elasticps.bench.explore_bench.load_grid`.
  Scaled to a kind: its shape (p, w) sits at the grid's
  ``(1 + (p - 1) / TASK_SCALE, 1 + (w - 1) / TASK_SCALE)`` (the simulated kinds
  ask for up to 8 PS and 16 workers, the grid measured up to 4 and 8), so
  odd counts fall on measured shapes and the others between them
  (bilinear interpolation between the four measured medians around it).
  Outside the measured shapes nothing is extrapolated: a shape beyond the
  grid's largest p or w takes the speed at its edge, a hole in a row (p + w
  > 10) the speed of the row's largest measured w (more tasks than measured
  neither gain nor lose). Speeds are scaled so that the grid's best median
  is the kind's best Optimus speed (all traffic crossing, within 8 x 16),
  so workloads stay comparable; a batch other than the kind's scales like
  the Optimus form does. The measurements include their own placement: the
  surface does not depend on where the simulator puts the tasks.

``grid``: every PS job follows the grid. ``mixed``: each PS job draws one of
:data:`SURFACES` from its own seeded stream (the same job, the same surface,
whatever the policy). Under either, a report's pass-to-pass noise is the
measured :data:`MEASURED_NOISE`. All-reduce (GPU) kinds keep their own form
under every truth.

Pure code: no clock, no Ray; the grid file is read once when a truth is made.
"""

from __future__ import annotations

import functools
import math
import random
import statistics
from dataclasses import dataclass
from pathlib import Path

from elasticps.errors import ConfigError
from elasticps.sched.synthetic import ModelKind, kind_speed, optimus_samples_per_s

TRUTHS = ("optimus", "grid", "mixed")
#: The surfaces ``mixed`` draws among (none is the fitted form).
SURFACES = ("saturation", "straggler", "grid")
OPTIMUS = "optimus"
#: Relative sd of a report, pass to pass, as measured on real runs (issue 32).
MEASURED_NOISE = 0.14
#: Shards a node serves at full speed; more on one node share its bandwidth.
NIC_SHARDS = 2
#: A shard's reply is late by an exponential delay of this x t1 on average.
PS_TAIL = 2.0
#: A worker's compute varies by an exponential share of its mean this large.
WORKER_TAIL = 0.2
#: A simulated shape counts this many times the grid's tasks, per axis.
TASK_SCALE = 2.0
#: The grid the ``grid`` surface follows: the project's own ``bench shapes`` run.
GRID_PATH = Path(__file__).resolve().parents[2] / "docs" / "results" / "bench-shapes.json"
#: Shape limits a kind's best Optimus speed is taken over (the synthetic workload's).
KIND_LIMITS = (8, 16)


@dataclass(frozen=True)
class Grid:
    """Measured medians on a full (p, w) table, holes filled (see above)."""

    table: tuple[tuple[float, ...], ...]  # table[p - 1][w - 1], samples/s
    best: float

    @property
    def max_ps(self) -> int:
        return len(self.table)

    @property
    def max_workers(self) -> int:
        return len(self.table[0])

    def at(self, x: float, y: float) -> float:
        """Samples/s at grid coordinates (x PS, y workers): bilinear between
        measured shapes, clamped to the grid's edges."""
        x = min(max(x, 1.0), float(self.max_ps))
        y = min(max(y, 1.0), float(self.max_workers))
        i, j = int(x), int(y)  # the measured shape at or below, 1-based
        fx, fy = x - i, y - j  # 0 on the last row or column
        i1, j1 = min(i + 1, self.max_ps), min(j + 1, self.max_workers)
        t = self.table
        return (
            (1 - fx) * (1 - fy) * t[i - 1][j - 1]
            + fx * (1 - fy) * t[i1 - 1][j - 1]
            + (1 - fx) * fy * t[i - 1][j1 - 1]
            + fx * fy * t[i1 - 1][j1 - 1]
        )


@functools.lru_cache(maxsize=8)
def load_truth_grid(path: str) -> Grid:
    """The grid of ``path`` (a ``bench shapes`` JSON) as a full table."""
    from elasticps.bench.explore_bench import load_grid

    runs, _, _ = load_grid(path)  # a ConfigError naming the file where it is no grid
    median = {shape: statistics.median(v) for shape, v in runs.items()}
    max_ps, max_workers = max(p for p, _ in median), max(w for _, w in median)
    table = []
    for p in range(1, max_ps + 1):
        row = [median.get((p, w)) for w in range(1, max_workers + 1)]
        if all(v is None for v in row):
            raise ConfigError(f"{path}: no shape measured with {p} PS")
        last = next(v for v in row if v is not None)
        filled = []
        for v in row:  # a hole takes the speed of the row's largest measured w below it
            last = v if v is not None else last
            filled.append(last)
        table.append(tuple(filled))
    return Grid(tuple(table), max(median.values()))


@dataclass(frozen=True)
class Truth:
    """Which ground truth a run uses; ``speed`` is every PS job's true speed."""

    name: str = OPTIMUS
    seed: int = 0
    grid: Grid | None = None

    def surface(self, job_id: str, kind: ModelKind) -> str:
        """The surface a job follows (its own seeded draw under ``mixed``)."""
        among = self.surfaces_of(kind)
        return among[0] if len(among) == 1 else random.Random(f"{self.seed}:truth:{job_id}").choice(among)

    def surfaces_of(self, kind: ModelKind) -> tuple[str, ...]:
        """Every surface a job of ``kind`` may follow under this truth."""
        if self.name == OPTIMUS or kind.allreduce:
            return (OPTIMUS,)
        return ("grid",) if self.name == "grid" else SURFACES

    def noise(self, configured: float) -> float:
        """A report's relative noise: the configured one under optimus, else the measured one."""
        return configured if self.name == OPTIMUS else MEASURED_NOISE

    def speed(
        self,
        surface: str,
        kind: ModelKind,
        p: int,
        w: int,
        cross: float,
        local_factor: float,
        batch: int | None = None,
        busiest_ps: int = 1,
    ) -> float:
        """True samples/s of a job following ``surface`` at (p, w) with
        ``cross`` of its traffic crossing nodes and at most ``busiest_ps``
        shards on one node."""
        if surface == OPTIMUS or kind.allreduce:
            return kind_speed(kind, p, w, cross, local_factor, batch)
        if p < 1 or w < 1:
            return 0.0
        t0, t1, t2, t3, t4 = kind.theta
        m = batch or kind.batch
        traffic = t2 * (w / p) * (cross + (1.0 - cross) * local_factor)
        if surface == "saturation":
            return m / (t0 * m / w + t1 + traffic * max(1.0, busiest_ps / NIC_SHARDS) + t3 * w + t4 * p)
        if surface == "straggler":
            compute = t0 * m / w * (1.0 + WORKER_TAIL * (_harmonic(w) - 1.0))
            return m / (compute + t1 + traffic + t3 * w + t4 * p + PS_TAIL * t1 * (_harmonic(p) - 1.0))
        if surface == "grid":
            if self.grid is None:
                raise ConfigError("the grid surface needs a measured grid")
            at = self.grid.at(1.0 + (p - 1) / TASK_SCALE, 1.0 + (w - 1) / TASK_SCALE)
            speed = at * _best_optimus(kind) / self.grid.best
            if m != kind.batch:  # the batch's effect as in the Optimus form
                speed *= kind_speed(kind, p, w, cross, local_factor, m) / kind_speed(kind, p, w, cross, local_factor)
            return speed
        raise ConfigError(f"no truth surface {surface!r} (surfaces: {', '.join((OPTIMUS, *SURFACES))})")


#: The default truth: the Optimus form for every job.
OPTIMUS_TRUTH = Truth()


def make_truth(name: str, seed: int = 0, grid_path: str | Path = GRID_PATH) -> Truth:
    """The truth ``name`` (one of :data:`TRUTHS`); the grid is read for ``grid`` and ``mixed``."""
    if name not in TRUTHS:
        raise ConfigError(f"no truth {name!r} (truths: {', '.join(TRUTHS)})")
    grid = None if name == OPTIMUS else load_truth_grid(str(grid_path))
    return Truth(name, seed, grid)


def busiest_on_a_node(p: int, nodes: int) -> int:
    """The most shards on one node when ``p`` are spread evenly over ``nodes``."""
    return math.ceil(p / max(1, min(p, nodes))) if p > 0 else 0


def _harmonic(n: int) -> float:
    return sum(1.0 / k for k in range(1, n + 1))


@functools.lru_cache(maxsize=64)
def _best_optimus(kind: ModelKind) -> float:
    max_ps, max_workers = KIND_LIMITS
    return max(optimus_samples_per_s(kind, p, w) for p in range(1, max_ps + 1) for w in range(1, max_workers + 1))

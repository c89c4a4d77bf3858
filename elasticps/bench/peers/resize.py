"""What a resize costs, from a run's timeline of steps.

Every system's resize run yields a :class:`Timeline`: the time of each step
(or window of steps) that made new progress, its samples and worker count,
and the times the changes were asked for. A system that restarts from a
checkpoint redoes the steps after it; those redone steps are not progress,
so its timeline counts only samples past the furthest point reached before.

For a change asked at ``t_req`` (all figures from the timeline alone):

- ``rate_before``: samples/s over the last ``HOLD_SHARE`` of the time before
  ``t_req`` since the previous change settled; ``rate_after``: the same over
  the last ``HOLD_SHARE`` of the time until the next change (or the end);
- ``seconds_to_full_speed``: from ``t_req`` to the first step at the new worker
  count from which the next ``SPAN_S`` seconds run at >= ``FULL`` of
  ``rate_after``;
- ``samples_lost``: how far the job fell behind the slower of its two steady
  rates between ``t_req`` and full speed, ``min(rate_before, rate_after) *
  seconds - samples trained``, at least 0. A live change that keeps training
  while new workers start loses nothing; a stop-and-restart loses its stall.

A system that knows its new processes may also record ``start_cpu_s`` for a
change: the CPU time they used from their start until they trained. Where
they start on the cores the job trains on (one small machine), that time is
taken from the job: it bounds what a change that starts them can save.

What a system paid before the timed window to make its changes cheaper (the
start of elasticps's standby workers) is kept apart, in ``before_window``:
it is not in the samples lost, and must be read beside them.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

HOLD_SHARE = 0.5
FULL = 0.9
SPAN_S = 2.0


@dataclass
class Timeline:
    system: str
    points: list[tuple[float, int, int, float]] = field(default_factory=list)  # (t, samples, workers, loss)
    changes: list[tuple[float, int]] = field(default_factory=list)  # (t asked, workers asked for)
    how: str = ""
    start_cpu_s: dict[int, float] = field(default_factory=dict)  # change index: its new processes' CPU until they ran
    before_window: dict[str, float] = field(default_factory=dict)  # paid before the first step timed

    def add(self, t: float, samples: int, workers: int, loss: float = float("nan")) -> None:
        self.points.append((t, samples, workers, loss))

    def mark(self, t: float, workers: int) -> None:
        self.changes.append((t, workers))

    def started(self, cpu_s: float) -> None:
        """The newest change's new processes used ``cpu_s`` CPU seconds until they ran."""
        self.start_cpu_s[len(self.changes) - 1] = cpu_s

    @classmethod
    def from_steps(cls, system: str, rows: list[tuple[float, int, int, float]], batch: int) -> Timeline:
        """From ``(time, step, workers, loss)`` rows of a run that may redo steps after a restart."""
        timeline = cls(system)
        furthest = -1
        for t, step, workers, loss in sorted(rows):
            if step > furthest:
                timeline.add(t, batch * (step - furthest if furthest >= 0 else 1), workers, loss)
                furthest = step
        return timeline

    def samples(self, a: float, b: float) -> int:
        return sum(s for t, s, _, _ in self.points if a < t <= b)

    def rate(self, a: float, b: float) -> float:
        return self.samples(a, b) / (b - a) if b > a else float("nan")

    def losses(self) -> list[float]:
        return [loss for _, _, _, loss in sorted(self.points)]

    def to_json(self) -> dict[str, Any]:
        t0 = self.points[0][0] if self.points else 0.0
        return {
            "how": self.how,
            "changes": [[round(t - t0, 3), w] for t, w in self.changes],
            "steps": [[round(t - t0, 3), s, w] for t, s, w, _ in self.points],
            "start_cpu_s": [_rounded(self.start_cpu_s.get(i)) for i in range(len(self.changes))],
            "before_window": self.before_window,
        }


def change_costs(timeline: Timeline) -> list[dict[str, Any]]:
    """The cost of each change of ``timeline`` (see the module's rules)."""
    if not timeline.points or not timeline.changes:
        return []
    start, end = timeline.points[0][0], timeline.points[-1][0]
    out = []
    for i, (t_req, workers) in enumerate(timeline.changes):
        prev = start if i == 0 else _settled(timeline, i - 1)
        nxt = timeline.changes[i + 1][0] if i + 1 < len(timeline.changes) else end
        before = timeline.rate(t_req - HOLD_SHARE * (t_req - prev), t_req)
        after = timeline.rate(nxt - HOLD_SHARE * (nxt - _first_at(timeline, t_req, workers)), nxt)
        t_full = _full_speed_at(timeline, t_req, nxt, workers, after)
        ref = min(before, after)
        trained = timeline.samples(t_req, t_full)
        out.append(
            {
                "to_workers": workers,
                "rate_before": before,
                "rate_after": after,
                "seconds_to_full_speed": t_full - t_req,
                "samples_lost": max(0.0, ref * (t_full - t_req) - trained),
                "start_cpu_s": timeline.start_cpu_s.get(i),
            }
        )
    return out


def summarize(timeline: Timeline) -> dict[str, Any]:
    """``{samples_lost, seconds_to_full_speed}`` per resize (means over the changes), and each change."""
    costs = change_costs(timeline)
    common = {"changes": costs, "how": timeline.how, "before_window": dict(timeline.before_window)}
    if not costs:
        return {"samples_lost": None, "seconds_to_full_speed": None, **common}
    return {
        "samples_lost": statistics.fmean(c["samples_lost"] for c in costs),
        "seconds_to_full_speed": statistics.fmean(c["seconds_to_full_speed"] for c in costs),
        **common,
    }


def _rounded(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def _first_at(timeline: Timeline, t_req: float, workers: int) -> float:
    """The first step after ``t_req`` at ``workers`` workers (``t_req`` if none)."""
    return next((t for t, _, w, _ in sorted(timeline.points) if t > t_req and w == workers), t_req)


def _settled(timeline: Timeline, i: int) -> float:
    t_req, workers = timeline.changes[i]
    return _first_at(timeline, t_req, workers)


def _full_speed_at(timeline: Timeline, t_req: float, t_end: float, workers: int, rate_after: float) -> float:
    for t, _, w, _ in sorted(timeline.points):
        if t <= t_req or w != workers or t >= t_end:
            continue
        b = min(t + SPAN_S, t_end)
        if b > t and timeline.rate(t, b) >= FULL * rate_after:
            return t
    return t_end


def log_step(log: TextIO, step: int, workers: int, loss: float) -> None:
    """One line of a step log (what :func:`read_step_log` reads), written through at once."""
    log.write(f"{time.time():.6f} {step} {workers} {loss:.6f}\n")
    log.flush()


def read_step_log(path: Path) -> list[tuple[float, int, int, float]]:
    """``(time, step, workers, loss)`` rows of a step log (``time step workers loss`` lines)."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 4:
            rows.append((float(parts[0]), int(parts[1]), int(parts[2]), float(parts[3])))
    return rows


def wait_for_workers(
    path: Path, workers: int, after: float, check: Callable[[], None], what: str, timeout_s: float = 300.0
) -> None:
    """Until the step log at ``path`` has a step at ``workers`` workers after ``after``;
    ``check()`` raises if the run died meanwhile."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(r[2] == workers and r[0] > after for r in read_step_log(path)):
            return
        check()
        time.sleep(0.2)
    raise TimeoutError(f"{what} did not train at {workers} workers within {timeout_s:.0f} s")

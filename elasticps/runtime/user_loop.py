"""What the controller does differently when the workers run a user's own loop.

The step protocol is the same (:mod:`elasticps.runtime.loop_worker`); on top
of it the controller: takes the user optimizer's hyperparameters of a step
from the first worker's statistics, keeps the metrics the loop reported,
hands a worker that joins the registered state of one already there (a
snapshot taken at a step boundary), takes each epoch's reports at its end
(the epoch's metric), and at the end lets every loop finish.
"""

from __future__ import annotations

import math
import threading
from typing import Any

import ray

from elasticps.errors import JobFailedError
from elasticps.runtime import tasks
from elasticps.runtime.membership import task_name
from elasticps.runtime.reports import MetricReport
from elasticps.runtime.task_group import TaskGroup

#: How long the loops may take after the last step (their last evaluation) before the job ends anyway.
FINISH_TIMEOUT_S = 300.0


def is_loop(program: Any) -> bool:
    from elasticps.loop.program import LoopProgram

    return isinstance(program, LoopProgram)


def _records(raw: list[dict[str, Any]]) -> list[MetricReport]:
    return [MetricReport(r["step"], r["epoch"], dict(r["metrics"])) for r in raw]


def epoch_metrics(records: list[MetricReport], epoch: int) -> tuple[float | None, dict[str, float | None]]:
    """The loop's last report in ``epoch``: its first value (the job's metric,
    as the manager and the dashboard show it) and all its values."""
    last = next((r for r in reversed(records) if r.epoch == epoch), None)
    if last is None or not last.values:
        return None, {}
    first = next(iter(last.values.values()))
    return (first if first is not None and math.isfinite(first) else None), dict(last.values)


def new_reports(kept: list[MetricReport], records: list[MetricReport]) -> list[MetricReport]:
    """``records`` less those ``kept`` already holds: every worker's loop makes
    the same reports, and one worker's may arrive after another's (a snapshot
    takes the first worker's at an epoch's end, the next step brings the rest)."""
    seen = {(r.step, r.epoch, tuple(r.values)) for r in kept[-64:]}
    return [r for r in records if (r.step, r.epoch, tuple(r.values)) not in seen]


def step_metrics(stats: list[dict[str, Any]]) -> list[MetricReport]:
    """The reports that came with a step: the first worker's that has any
    (every worker runs the same loop; one report per step is kept)."""
    for s in stats:
        if s.get("reports"):
            return _records(s["reports"])
    return []


def snapshot(
    worker: tasks.Task,
    param_refs: list[Any],
    bounds: list[tuple[int, int]],
    step: int,
    next_epoch: int | None,
    timeout_s: float,
) -> tuple[bytes | None, list[MetricReport]]:
    """The registered state of ``worker`` (the group's ``worker-0``)'s loop at
    this step boundary, and its reports. The loop's code up to its next batch
    (an epoch's evaluation) may take ``timeout_s``; a loop that takes longer
    is taken for hung (:func:`tasks.answers`: the worker is stopped, and the
    read fails with a Ray error, which the job recovers from)."""
    ref = worker.handle.snapshot.remote(param_refs, bounds, step, next_epoch)
    [out], error = tasks.answers(
        [(task_name("worker", 0), worker.handle, ref)],
        timeout_s,
        f"hand over its loop's state at step {step} within {timeout_s:g} s (step_timeout_s)",
    )
    if error is not None:
        raise error
    return out["state"], _records(out["reports"])


def finish(
    workers: list[tasks.Task], param_refs: list[Any], bounds: list[tuple[int, int]], step: int
) -> tuple[list[MetricReport], bytes | None]:
    """Give every loop the final parameters and let it end; returns the reports
    of its last part (from the first worker that made any) and the first
    worker's registered state at its end. A worker that dies meanwhile is
    passed over (every loop ends the same way); the job fails if the loop's
    code failed, or if no worker's loop ended."""
    refs = [w.handle.finish.remote(param_refs, bounds, step, FINISH_TIMEOUT_S) for w in workers]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=FINISH_TIMEOUT_S + 30)
    outs, died = [], None
    for ref in ready:
        try:
            outs.append(ray.get(ref))
        except ray.exceptions.RayActorError as exc:
            died = exc
        except ray.exceptions.RayError as exc:
            raise JobFailedError(f"the training loop failed after its last step: {exc}") from exc
    if died is not None and not outs:
        raise JobFailedError(f"every worker died after the last step: {died}") from died
    return step_metrics(outs), (outs[0]["state"] if outs else None)


class LoopState:
    """What the controller keeps of the users' loops between steps.

    ``state``: the registered state of the first worker's loop as of step
    ``state_at`` (what a checkpoint holds); ``joiners``: ``{id(worker handle):
    registered state}`` for workers whose loop starts at the next step;
    ``metrics``: the reports the loops made (the newest ``keep``);
    ``finished``: the loops ran to their end. ``lock``: the controller's;
    ``timeout_s``: how long a snapshot may take (:func:`snapshot`)."""

    def __init__(self, lock: threading.RLock, keep: int, timeout_s: float) -> None:
        self._lock = lock
        self._keep = keep
        self._timeout_s = timeout_s
        self.metrics: list[MetricReport] = []
        self.joiners: dict[int, bytes | None] = {}
        self.state: bytes | None = None
        self.state_at = -1
        self.finished = False

    def add_metrics(self, records: list[MetricReport]) -> None:
        with self._lock:
            self.metrics.extend(new_reports(self.metrics, records))
            del self.metrics[: -self._keep]

    def snapshot(self, group: TaskGroup, step: int, next_epoch: int | None) -> None:
        """The registered state now, from the first worker (kept as is once the
        loops ended; taken once per step: a loop waits at the boundary after
        its snapshot, so its state cannot change before the next step)."""
        if group.workers and not self.finished and self.state_at != step:
            self.state, metrics = snapshot(
                group.workers[0], group.param_refs, group.bounds, step, next_epoch, self._timeout_s
            )
            self.state_at = step  # once it came: a worker that died meanwhile leaves it to be taken again
            self.add_metrics(metrics)

    def finish(self, group: TaskGroup, step: int) -> None:
        metrics, self.state = finish(group.workers, group.param_refs, group.bounds, step)
        self.add_metrics(metrics)
        self.finished = True

    def join(self, workers: list[tasks.Task]) -> None:
        """``workers`` start with the state last snapshotted."""
        self.joiners.update({id(w.handle): self.state for w in workers})

    def resume(self, state: bytes | None, step: int, workers: list[tasks.Task]) -> None:
        """Go back to a checkpoint's state: every one of ``workers`` starts from it."""
        self.state, self.state_at = state, step
        self.joiners = {id(w.handle): state for w in workers}

    def stepped(self, stats: list[dict[str, Any]]) -> None:
        """A step stood: every loop in it has its state; keep its reports."""
        self.joiners = {}
        self.add_metrics(step_metrics(stats))

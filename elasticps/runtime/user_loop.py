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
from typing import Any

import ray

from elasticps.errors import JobFailedError
from elasticps.runtime import tasks
from elasticps.runtime.reports import MetricReport

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
    worker: tasks.Task, param_refs: list[Any], bounds: list[tuple[int, int]], step: int, next_epoch: int | None
) -> tuple[bytes | None, list[MetricReport]]:
    """The registered state of ``worker``'s loop at this step boundary, and its reports."""
    out = ray.get(worker.handle.snapshot.remote(param_refs, bounds, step, next_epoch))
    return out["state"], _records(out["reports"])


def finish(
    workers: list[tasks.Task], param_refs: list[Any], bounds: list[tuple[int, int]], step: int
) -> tuple[list[MetricReport], bytes | None]:
    """Give every loop the final parameters and let it end; returns the reports
    of its last part (from the first worker that made any) and the first
    worker's registered state at its end."""
    refs = [w.handle.finish.remote(param_refs, bounds, step, FINISH_TIMEOUT_S) for w in workers]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=FINISH_TIMEOUT_S + 30)
    outs = []
    for ref in ready:
        try:
            outs.append(ray.get(ref))
        except ray.exceptions.RayError as exc:
            raise JobFailedError(f"the training loop failed after its last step: {exc}") from exc
    return step_metrics(outs), (outs[0]["state"] if outs else None)

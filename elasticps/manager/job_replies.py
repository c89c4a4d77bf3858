"""What the API answers about a job: its record, why it waits, its latest
allocation and progress (:func:`job_json`, a :class:`JobOut`), and its
progress as log lines (:func:`job_log_lines`)."""

from __future__ import annotations

from typing import Any

from elasticps.manager.models import Allocation, JobOut, Progress
from elasticps.manager.service import Manager
from elasticps.manager.store import JobRecord
from elasticps.runtime import JobReport


def job_json(rec: JobRecord, manager: Manager) -> JobOut:
    out = JobOut(
        name=rec.name,
        state=rec.state,  # type: ignore[arg-type]
        submitted_at=rec.submitted_at,
        updated_at=rec.updated_at,
        spec=rec.spec,
    )
    waiting = manager.waiting.get(rec.name) if rec.state in ("pending", "running") else None
    if waiting is not None:
        out.reason, out.never_starts = waiting.reason, waiting.never
    elif rec.state == "failed":
        out.reason = manager.store.last_event(rec.name, "failed")
    allocations = manager.store.allocations(rec.name)
    if allocations:
        at, p, w, placement = allocations[-1]
        out.allocation = Allocation(at=at, num_ps=p, num_workers=w, placement=placement)
    status = manager.statuses().get(rec.name)
    report = manager.ended.get(rec.name) if status is None else None
    if status is not None:
        last = status.windows[-1] if status.windows else None
        kept = manager.store.progress(rec.name) or {} if last is None else {}  # a poll with no new window
        epochs = rec.info.epochs if rec.info else 0
        out.progress = Progress(
            step=status.step, epoch=status.epoch, epochs=epochs,
            samples_per_s=last.samples_per_s if last else kept.get("samples_per_s"),
            loss=last.loss if last else kept.get("loss"), metric=status.metric, metrics=status.metrics,
        )  # fmt: skip
    elif report is not None:
        last = report.windows[-1] if report.windows else None
        out.progress = Progress(
            step=report.step, epoch=report.epoch, epochs=report.epochs,
            samples_per_s=last.samples_per_s if last else None, loss=last.loss if last else None,
            metric=report.epoch_reports[-1].metric if report.epoch_reports else None,
            metrics=report.metrics[-1].values if report.metrics else {},
        )  # fmt: skip
    else:  # neither polled nor ended here (the manager was restarted since): the progress the store kept
        kept = manager.store.progress(rec.name)
        if kept is not None and kept.get("step") is not None:
            out.progress = Progress(
                step=kept["step"], epoch=kept.get("epoch") or 0, epochs=rec.info.epochs if rec.info else 0,
                samples_per_s=kept.get("samples_per_s"), loss=kept.get("loss"), metric=kept.get("metric"),
            )  # fmt: skip
    return out


def job_log_lines(report: JobReport, after_step: int = -1, after_event: int | None = None) -> list[dict[str, Any]]:
    """Windows and epochs of a report as ``{"step", "kind", "text"}`` lines, in
    step order, then the runtime's events (which carry no step, but their
    number: ``event``): those from ``after_event`` on, or with no
    ``after_event`` all of them if ``after_step`` is negative."""
    lines: list[dict[str, Any]] = []
    for w in report.windows:
        if w.last_step > after_step:
            t = w.mean_step_times
            text = (
                f"P={w.num_ps} W={w.num_workers} {w.samples_per_s:.0f} samples/s loss {w.loss:.4f} "
                f"step ms: compute {t.compute_s * 1e3:.1f} pull {t.pull_s * 1e3:.1f} push {t.push_s * 1e3:.1f} "
                f"update {t.update_s * 1e3:.1f} wait {t.wait_s * 1e3:.1f}"
            )
            lines.append({"step": w.last_step, "kind": "window", "text": text})
    for e in report.epoch_reports:
        if e.step > after_step:
            metric = f", metric {e.metric:.4f}" if e.metric is not None else ""
            lines.append(
                {"step": e.step, "kind": "epoch", "text": f"epoch {e.epoch} done in {e.elapsed_s:.1f} s{metric}"}
            )
    lines.sort(key=lambda line: (line["step"], line["kind"] != "window"))
    if after_event is not None or after_step < 0:
        first = max(0, report.events_total - len(report.events))  # the number of the oldest event kept
        lines += [
            {"step": None, "kind": "event", "text": msg, "event": first + i}
            for i, msg in enumerate(report.events)
            if first + i >= (after_event or 0)
        ]
    return lines
